use super::*;
use std::collections::BTreeMap;

const PROTO: &str = include_str!("../../../proto/epp/peers/v1/replica_sharing.proto");

/// One field as the `.proto` declares it.
#[derive(Debug)]
struct Field {
    name: String,
    number: u64,
    ty: String,
    repeated: bool,
}

/// What the `.proto` declares: the package, `Service.Method(stream In) returns (Out)`, and the
/// messages with their fields. Only the subset the file uses is understood; anything else fails.
#[derive(Debug, Default)]
struct Schema {
    package: String,
    rpcs: Vec<(String, String, String, String)>,
    messages: BTreeMap<String, Vec<Field>>,
}

fn tokens(text: &str) -> Vec<String> {
    let code: String = text
        .lines()
        .map(|l| l.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n");
    let spaced = ["{", "}", "(", ")", ";", "="]
        .iter()
        .fold(code, |s, p| s.replace(p, &format!(" {p} ")));
    spaced.split_whitespace().map(str::to_owned).collect()
}

fn parse(text: &str) -> Schema {
    let t = tokens(text);
    let mut s = Schema::default();
    let mut i = 0;
    while i < t.len() {
        match t[i].as_str() {
            "syntax" => {
                assert_eq!(t[i + 2], "\"proto3\"");
                i += 4;
            }
            "package" => {
                s.package = t[i + 1].clone();
                i += 3;
            }
            "service" => i = parse_service(&t, i, &mut s),
            "message" => i = parse_message(&t, i, &mut s),
            other => panic!("unexpected token {other:?} in the .proto"),
        }
    }
    s
}

fn parse_service(t: &[String], mut i: usize, s: &mut Schema) -> usize {
    let service = t[i + 1].clone();
    i += 3;
    while t[i] == "rpc" {
        // rpc Name ( stream In ) returns ( Out ) ;
        assert_eq!(
            (&*t[i + 2], &*t[i + 3], &*t[i + 5], &*t[i + 6]),
            ("(", "stream", ")", "returns")
        );
        s.rpcs.push((
            service.clone(),
            t[i + 1].clone(),
            t[i + 4].clone(),
            t[i + 8].clone(),
        ));
        i += 11;
    }
    assert_eq!(t[i], "}");
    i + 1
}

fn parse_message(t: &[String], mut i: usize, s: &mut Schema) -> usize {
    let name = t[i + 1].clone();
    i += 3;
    let mut fields = Vec::new();
    while t[i] != "}" {
        let repeated = t[i] == "repeated";
        if repeated {
            i += 1;
        }
        assert_eq!(
            (&*t[i + 2], &*t[i + 4]),
            ("=", ";"),
            "field at {}",
            t[i + 1]
        );
        fields.push(Field {
            ty: t[i].clone(),
            name: t[i + 1].clone(),
            number: t[i + 3].parse().expect("field number"),
            repeated,
        });
        i += 5;
    }
    s.messages.insert(name, fields);
    i + 1
}

/// A field's value as the Rust type holds it.
#[derive(Debug, PartialEq)]
enum Sample {
    Uint(u64),
    Bytes(Vec<u8>),
    Fixed64s(Vec<u64>),
}

/// A message's bytes as the Rust type encodes them, and its fields' values by name.
type Encoded = (Vec<u8>, Vec<(&'static str, Sample)>);

/// A value of every message with every field set (values that differ between the integer
/// encodings: a `uint32` read as `sint32` or `fixed32` would not match), and its fields by name.
fn samples() -> BTreeMap<&'static str, Encoded> {
    let p = Placement {
        ip: vec![10, 1, 2, 3],
        port: 4_000_000_000,
        ttl_ms: 300,
        keys: vec![1, u64::MAX, 0x0102_0304_0506_0708],
    };
    let s = ShareSummary {
        applied: 1 << 40,
        refused: 77,
    };
    BTreeMap::from([
        (
            "Placement",
            (
                p.encode_to_vec(),
                vec![
                    ("ip", Sample::Bytes(p.ip.clone())),
                    ("port", Sample::Uint(p.port.into())),
                    ("ttl_ms", Sample::Uint(p.ttl_ms.into())),
                    ("keys", Sample::Fixed64s(p.keys.clone())),
                ],
            ),
        ),
        (
            "ShareSummary",
            (
                s.encode_to_vec(),
                vec![
                    ("applied", Sample::Uint(s.applied)),
                    ("refused", Sample::Uint(s.refused)),
                ],
            ),
        ),
    ])
}

/// Protobuf wire records: field number → (wire type, payload).
fn records(mut b: &[u8]) -> BTreeMap<u64, (u64, Vec<u8>)> {
    let mut out = BTreeMap::new();
    while b.has_remaining() {
        let key = prost::encoding::decode_varint(&mut b).expect("tag");
        let payload = match key & 7 {
            0 => prost::encoding::decode_varint(&mut b)
                .expect("varint")
                .to_le_bytes()
                .to_vec(),
            1 => b.copy_to_bytes(8).to_vec(),
            2 => {
                let n = prost::encoding::decode_varint(&mut b).expect("length");
                b.copy_to_bytes(usize::try_from(n).expect("length"))
                    .to_vec()
            }
            w => panic!("wire type {w}"),
        };
        assert!(out.insert(key >> 3, (key & 7, payload)).is_none());
    }
    out
}

/// What a record holds, read as the `.proto` type says.
fn read(field: &Field, wire: u64, payload: &[u8]) -> Sample {
    let u64_of = |b: &[u8]| u64::from_le_bytes(b.try_into().expect("8 bytes"));
    match (field.ty.as_str(), field.repeated, wire) {
        ("uint32", false, 0) => {
            let v = u64_of(payload);
            assert!(u32::try_from(v).is_ok(), "{} out of uint32", field.name);
            Sample::Uint(v)
        }
        ("uint64", false, 0) => Sample::Uint(u64_of(payload)),
        ("bytes", false, 2) => Sample::Bytes(payload.to_vec()),
        // proto3 packs repeated scalars: one length-delimited record of 8-byte values.
        ("fixed64", true, 2) => Sample::Fixed64s(payload.chunks(8).map(u64_of).collect()),
        (ty, repeated, wire) => {
            panic!(
                "{}: {ty} (repeated {repeated}) on wire type {wire}",
                field.name
            )
        }
    }
}

#[test]
fn the_rust_messages_put_every_proto_field_on_the_wire_with_its_number_and_type() {
    let schema = parse(PROTO);
    let samples = samples();
    assert_eq!(
        schema.messages.keys().collect::<Vec<_>>(),
        samples.keys().collect::<Vec<_>>(),
        "a message in one and not the other"
    );
    for (name, fields) in &schema.messages {
        let (bytes, values) = &samples[name.as_str()];
        let mut on_wire = records(bytes);
        assert_eq!(fields.len(), values.len(), "{name}: field count");
        for f in fields {
            let (wire, payload) = on_wire
                .remove(&f.number)
                .unwrap_or_else(|| panic!("{name}.{} (= {}) not on the wire", f.name, f.number));
            let want = values
                .iter()
                .find(|(n, _)| *n == f.name)
                .unwrap_or_else(|| panic!("{name}.{} has no Rust field", f.name));
            assert_eq!(read(f, wire, &payload), want.1, "{name}.{}", f.name);
        }
        assert!(
            on_wire.is_empty(),
            "{name}: numbers not in the .proto: {on_wire:?}"
        );
    }
}

#[test]
fn the_service_path_and_its_messages_match_the_proto() {
    let schema = parse(PROTO);
    assert_eq!(schema.rpcs.len(), 1);
    let (service, method, input, output) = &schema.rpcs[0];
    assert_eq!(format!("{}.{service}", schema.package), SERVICE);
    assert_eq!(format!("/{SERVICE}/{method}"), SHARE_PATH);
    assert_eq!(
        (input.as_str(), output.as_str()),
        ("Placement", "ShareSummary")
    );
}

fn id(s: &str) -> EndpointId {
    EndpointId(s.parse().unwrap())
}

#[test]
fn placements_round_trip_for_ipv4_and_ipv6_endpoints() {
    for (endpoint, keys) in [
        ("10.1.2.3:8000", vec![1, u64::MAX, 42]),
        ("[fd00::7]:9000", vec![7]),
        ("10.0.0.1:1", vec![]),
    ] {
        let ttl = Duration::from_millis(1500);
        let got = decode_placement(&encode_placement(id(endpoint), &keys, ttl)).unwrap();
        assert_eq!(
            got,
            Entry {
                endpoint: id(endpoint),
                keys,
                ttl
            }
        );
    }
}

#[test]
fn a_ttl_beyond_u32_milliseconds_saturates() {
    let b = encode_placement(id("10.0.0.1:8000"), &[1], Duration::from_secs(u64::MAX / 2));
    let got = decode_placement(&b).unwrap();
    assert_eq!(got.ttl, Duration::from_millis(u64::from(u32::MAX)));
}

#[test]
fn keys_beyond_the_limit_are_left_out_and_a_full_message_fits_the_receive_limit() {
    let keys: Vec<u64> = (0..MAX_KEYS as u64 + 10).map(|k| k | 1 << 63).collect();
    let b = encode_placement(id("[fd00::1]:65535"), &keys, Duration::MAX);
    assert!(b.len() <= MAX_MESSAGE, "{} bytes", b.len());
    assert_eq!(decode_placement(&b).unwrap().keys, keys[..MAX_KEYS]);
}

#[test]
fn malformed_placements_are_errors() {
    let msg = |ip: Vec<u8>, port: u32, keys: usize| {
        Placement {
            ip,
            port,
            ttl_ms: 1,
            keys: vec![9; keys],
        }
        .encode_to_vec()
    };
    assert!(matches!(
        decode_placement(b"\xff\xff\xff"),
        Err(WireError::Decode(_))
    ));
    assert_eq!(
        decode_placement(&msg(vec![1, 2, 3], 80, 1)),
        Err(WireError::Address(3))
    );
    assert_eq!(decode_placement(&[]), Err(WireError::Address(0)));
    assert_eq!(
        decode_placement(&msg(vec![1, 2, 3, 4], 0, 1)),
        Err(WireError::Port(0))
    );
    assert_eq!(
        decode_placement(&msg(vec![1, 2, 3, 4], 65536, 1)),
        Err(WireError::Port(65536))
    );
    assert_eq!(
        decode_placement(&msg(vec![1, 2, 3, 4], 80, MAX_KEYS + 1)),
        Err(WireError::TooMany(MAX_KEYS + 1))
    );
}

#[test]
fn every_truncation_and_byte_flip_decodes_or_errs_without_panicking() {
    let good = encode_placement(id("10.0.0.1:8000"), &[5, 6, 7], Duration::from_secs(2));
    let mut errors = 0;
    for n in 0..good.len() {
        errors += usize::from(decode_placement(&good[..n]).is_err());
    }
    assert!(
        errors > good.len() / 2,
        "{errors} of {} truncations refused",
        good.len()
    );
    for i in 0..good.len() {
        let mut b = good.to_vec();
        b[i] ^= 0xff;
        let _ = decode_placement(&b);
    }
}
