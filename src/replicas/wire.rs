//! The replica-sharing messages of `proto/epp/peers/v1/replica_sharing.proto`, written by hand,
//! and the gRPC codec that carries them.
//!
//! Why by hand: the machine that builds epp has no `protoc`, and a pure-Rust compiler
//! (`protox` feeding `tonic-prost-build`) would add a parser, a reflection crate and a build
//! script to every cold build for two messages of six scalar fields and one method. The test at
//! the bottom parses the `.proto` and checks, field by field, that what these types put on the
//! wire has the number and the type the file declares, so the two cannot drift apart.
//!
//! The codec moves raw bytes in the direction that needs checking: the server receives each
//! message as bytes and decodes it itself ([`decode_placement`]), so a malformed message is
//! refused and counted by the handler instead of failing the stream inside tonic.

use super::Placement as Entry;
use crate::endpoint::EndpointId;
use bytes::{Buf, BufMut, Bytes};
use prost::Message;
use std::marker::PhantomData;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Status;

/// The gRPC service name (`package.Service`).
pub(crate) const SERVICE: &str = "epp.peers.v1.ReplicaSharing";
/// The path of the one method, `Share`.
pub(crate) const SHARE_PATH: &str = "/epp.peers.v1.ReplicaSharing/Share";
/// The request metadata key naming the calling replica.
pub(crate) const REPLICA_HEADER: &str = "x-epp-replica";
/// Keys sent per placement: the rest of a longer prompt is left out (its first blocks are what
/// keeps the prompt's next request together).
pub(crate) const MAX_KEYS: usize = 4096;
/// The largest message a receiver decodes: a placement with [`MAX_KEYS`] keys and a 16-byte
/// address, with room for the field tags.
pub(crate) const MAX_MESSAGE: usize = MAX_KEYS * 8 + 64;

/// `Placement` of the `.proto`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct Placement {
    #[prost(bytes = "vec", tag = "1")]
    pub(crate) ip: Vec<u8>,
    #[prost(uint32, tag = "2")]
    pub(crate) port: u32,
    #[prost(uint32, tag = "3")]
    pub(crate) ttl_ms: u32,
    #[prost(fixed64, repeated, tag = "4")]
    pub(crate) keys: Vec<u64>,
}

/// `ShareSummary` of the `.proto`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ShareSummary {
    #[prost(uint64, tag = "1")]
    pub(crate) applied: u64,
    #[prost(uint64, tag = "2")]
    pub(crate) refused: u64,
}

/// Why a received message is refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WireError {
    #[error("not a Placement message: {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("address of {0} bytes (4 or 16)")]
    Address(usize),
    #[error("port {0} (1 to 65535)")]
    Port(u32),
    #[error("{0} keys (at most {MAX_KEYS})")]
    TooMany(usize),
}

/// The message for `p`, with `ttl` the entry's remaining time to live; keys beyond
/// [`MAX_KEYS`] are left out.
pub(crate) fn encode_placement(endpoint: EndpointId, keys: &[u64], ttl: Duration) -> Bytes {
    let ip = match endpoint.0.ip() {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    };
    let msg = Placement {
        ip,
        port: u32::from(endpoint.0.port()),
        ttl_ms: u32::try_from(ttl.as_millis()).unwrap_or(u32::MAX),
        keys: keys[..keys.len().min(MAX_KEYS)].to_vec(),
    };
    Bytes::from(msg.encode_to_vec())
}

/// The placement a received message carries; anything malformed is an error, never a panic.
pub(crate) fn decode_placement(buf: &[u8]) -> Result<Entry, WireError> {
    let msg = Placement::decode(buf)?;
    let ip = match msg.ip.len() {
        4 => IpAddr::V4(Ipv4Addr::from(
            <[u8; 4]>::try_from(&msg.ip[..]).unwrap_or_default(),
        )),
        16 => IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(&msg.ip[..]).unwrap_or_default(),
        )),
        n => return Err(WireError::Address(n)),
    };
    let port = u16::try_from(msg.port)
        .ok()
        .filter(|p| *p != 0)
        .ok_or(WireError::Port(msg.port))?;
    if msg.keys.len() > MAX_KEYS {
        return Err(WireError::TooMany(msg.keys.len()));
    }
    Ok(Entry {
        endpoint: EndpointId(SocketAddr::new(ip, port)),
        keys: msg.keys,
        ttl: Duration::from_millis(u64::from(msg.ttl_ms)),
    })
}

/// A codec whose outgoing messages are already-encoded bytes and whose incoming ones are the
/// prost message `In`: the caller's side of `Share` (it encodes each placement once for every
/// peer), and a test's way to send bytes that are not a `Placement`.
pub(crate) struct BytesOut<In>(PhantomData<In>);

/// A codec whose outgoing messages are the prost message `Out` and whose incoming ones are raw
/// bytes: the receiver's side of `Share`, which decodes (and refuses) each message itself.
pub(crate) struct BytesIn<Out>(PhantomData<Out>);

impl<In> Default for BytesOut<In> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<Out> Default for BytesIn<Out> {
    fn default() -> Self {
        Self(PhantomData)
    }
}

impl<In: Message + Default + Send + 'static> Codec for BytesOut<In> {
    type Encode = Bytes;
    type Decode = In;
    type Encoder = RawEncoder;
    type Decoder = ProstDecoder<In>;
    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }
    fn decoder(&mut self) -> ProstDecoder<In> {
        ProstDecoder(PhantomData)
    }
}

impl<Out: Message + Send + 'static> Codec for BytesIn<Out> {
    type Encode = Out;
    type Decode = Bytes;
    type Encoder = ProstEncoder<Out>;
    type Decoder = RawDecoder;
    fn encoder(&mut self) -> ProstEncoder<Out> {
        ProstEncoder(PhantomData)
    }
    fn decoder(&mut self) -> RawDecoder {
        RawDecoder
    }
}

/// Writes bytes as they are.
pub(crate) struct RawEncoder;
/// Reads a message's bytes as they are.
pub(crate) struct RawDecoder;
/// Encodes a prost message.
pub(crate) struct ProstEncoder<T>(PhantomData<T>);
/// Decodes a prost message.
pub(crate) struct ProstDecoder<T>(PhantomData<T>);

impl Encoder for RawEncoder {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawDecoder {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

impl<T: Message> Encoder for ProstEncoder<T> {
    type Item = T;
    type Error = Status;
    fn encode(&mut self, item: T, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("encoding: {e}")))
    }
}

impl<T: Message + Default> Decoder for ProstDecoder<T> {
    type Item = T;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<T>, Status> {
        T::decode(src)
            .map(Some)
            .map_err(|e| Status::internal(format!("decoding: {e}")))
    }
}

#[cfg(test)]
mod tests;
