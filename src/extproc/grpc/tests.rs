use super::*;
use envoy_types::pb::envoy::service::ext_proc::v3::{processing_request, HttpBody};
use tonic::Code;

fn body_msg(bytes: &[u8], eos: bool) -> ProcessingRequest {
    ProcessingRequest {
        request: Some(processing_request::Request::RequestBody(HttpBody {
            body: bytes.to_vec(),
            end_of_stream: eos,
            ..Default::default()
        })),
        ..Default::default()
    }
}

fn framed(msgs: &[ProcessingRequest]) -> Vec<u8> {
    let mut out = Vec::new();
    for m in msgs {
        out.extend_from_slice(&encode(m, usize::MAX).unwrap());
    }
    out
}

/// An inbound stream whose data frames are `wire` cut at `cuts`.
fn inbound(wire: &[u8], cuts: &[usize], max: usize) -> Inbound {
    let mut frames = Vec::new();
    let mut at = 0;
    for &c in cuts.iter().chain(std::iter::once(&wire.len())) {
        let c = c.min(wire.len());
        if c > at {
            frames.push(Ok::<_, Status>(Frame::data(Bytes::copy_from_slice(
                &wire[at..c],
            ))));
            at = c;
        }
    }
    let body = Body::new(http_body_util::StreamBody::new(futures::stream::iter(
        frames,
    )));
    Inbound::new(body, max)
}

async fn all(mut inbound: Inbound) -> Result<Vec<ProcessingRequest>, Status> {
    let mut out = Vec::new();
    while let Some(m) = inbound.message().await? {
        out.push(m);
    }
    Ok(out)
}

#[tokio::test]
async fn messages_are_read_whatever_the_frames() {
    let msgs = vec![
        body_msg(b"", false),
        body_msg(&[7u8; 70_000], false),
        body_msg(b"end", true),
    ];
    let wire = framed(&msgs);
    let cut_sets: Vec<Vec<usize>> = vec![
        vec![],
        vec![1, 2, 3, 4, 5, 6],
        vec![10, 40_000, 70_010],
        (0..wire.len()).step_by(997).collect(),
    ];
    for cuts in cut_sets {
        let got = all(inbound(&wire, &cuts, 1 << 20)).await.unwrap();
        assert_eq!(got, msgs, "cuts {cuts:?}");
    }
}

#[tokio::test]
async fn faults_are_the_statuses_tonic_gives() {
    let wire = framed(&[body_msg(&[1u8; 100], true)]);
    let err = all(inbound(&wire, &[], 50)).await.unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange, "{err:?}");
    assert!(err.message().contains("the limit is: 50 bytes"), "{err:?}");

    let mut compressed = wire.clone();
    compressed[0] = 1;
    let err = all(inbound(&compressed, &[], 1 << 20)).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented, "{err:?}");

    let err = all(inbound(&wire[..wire.len() - 1], &[3], 1 << 20))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err:?}");
    assert!(err.message().contains("inside a message"), "{err:?}");

    let garbage = [0u8, 0, 0, 0, 2, 0xff, 0xff];
    let err = all(inbound(&garbage, &[], 1 << 20)).await.unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err:?}");
}

#[test]
fn responses_are_prefixed_and_bounded() {
    let msg = body_msg(b"abc", true);
    let data = encode(&msg, usize::MAX).unwrap();
    assert_eq!(data[0], 0);
    let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
    assert_eq!(len, data.len() - PREFIX);
    assert_eq!(ProcessingRequest::decode(&data[PREFIX..]).unwrap(), msg);
    let err = encode(&msg, 3).unwrap_err();
    assert_eq!(err.code(), Code::OutOfRange);
    let t = trailers(&Status::ok(""));
    assert_eq!(t.get("grpc-status").unwrap(), "0");
}

#[test]
fn compressed_streams_are_refused_identity_is_not() {
    let mut h = http::HeaderMap::new();
    assert!(compressed(&h).is_none());
    h.insert("grpc-encoding", http::HeaderValue::from_static("identity"));
    assert!(compressed(&h).is_none());
    h.insert("grpc-encoding", http::HeaderValue::from_static("gzip"));
    assert_eq!(compressed(&h).unwrap().code(), Code::Unimplemented);
}

#[tokio::test]
async fn a_message_inside_one_frame_is_not_copied() {
    let wire = Bytes::from(framed(&[body_msg(&[9u8; 1000], true)]));
    let body = Body::new(http_body_util::StreamBody::new(futures::stream::iter(
        vec![Ok::<_, Status>(Frame::data(wire.clone()))],
    )));
    let mut inbound = Inbound::new(body, 1 << 20);
    // Buffer the frame, then take the message's bytes as the decoder does.
    let frame = inbound
        .body
        .frame()
        .await
        .unwrap()
        .unwrap()
        .into_data()
        .unwrap();
    inbound.buffered = frame.len();
    inbound.chunks.push_back(frame);
    let bytes = inbound.take_message().unwrap().unwrap();
    assert_eq!(
        bytes.as_ptr(),
        wire[PREFIX..].as_ptr(),
        "a slice of the frame"
    );
    assert_eq!(inbound.buffered, 0);
}
