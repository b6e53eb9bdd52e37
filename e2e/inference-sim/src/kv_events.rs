//! KV-cache events on the wire, as vLLM publishes them.
//!
//! Why: precise prefix-cache routing (llm-d-kv-cache, epp's `kvevents`) builds
//! its index from these messages, so the framing, encodings and hashes must be
//! vLLM's (reference section 4):
//!
//! - ZMQ PUB; three frames: topic, u64 big-endian sequence from 0, payload.
//! - Payload: msgpack `[ts, [events...], dp_rank]`, one batch per engine step
//!   that produced events.
//! - Events positional (`["BlockStored", hashes, parent, tokens, block_size,
//!   lora_id, "GPU"(, lora_name)]`) or, after vLLM PR #42892, maps keyed by
//!   `type`; chosen with [`EventEncoding`].
//! - Hashes are the low 64 bits of the sha256_cbor digests (msgpack uint64).
//! - Optional ROUTER replay socket: `[id, "", start_seq]` → every buffered
//!   batch with `seq >= start`, then `[id, "", FF×8, ""]`.

use thiserror::Error;

use super::kv_cache::KvEvent;

mod publisher;

pub use publisher::{KvPublisher, PublisherEndpoints};

/// Inner event encoding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum EventEncoding {
    /// Positional arrays (vLLM ≤ v0.23).
    #[default]
    Array,
    /// Maps keyed by field name (vLLM after PR #42892).
    Map,
}

/// Whether the PUB socket binds or connects.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum SocketMode {
    /// vLLM's rule: bind if the endpoint has `*`, `::`, `ipc://` or `inproc://`.
    #[default]
    Auto,
    Bind,
    Connect,
}

/// `--kv-events-config` equivalent.
#[derive(Clone, Debug, PartialEq)]
pub struct KvEventsConfig {
    /// PUB endpoint, e.g. `tcp://*:5557` (bind) or `tcp://127.0.0.1:5557` (connect).
    pub endpoint: String,
    pub mode: SocketMode,
    /// ROUTER replay endpoint (always binds).
    pub replay_endpoint: Option<String>,
    /// Topic frame; llm-d expects `kv@<ip>:<port>@<model>`.
    pub topic: String,
    pub encoding: EventEncoding,
    /// Batches kept for replay (vLLM `buffer_steps`).
    pub buffer_steps: usize,
    /// `data_parallel_rank` in every batch.
    pub dp_rank: u32,
}

impl KvEventsConfig {
    /// True when the PUB socket binds (vLLM's rule unless forced).
    pub fn binds(&self) -> bool {
        match self.mode {
            SocketMode::Bind => true,
            SocketMode::Connect => false,
            SocketMode::Auto => {
                let e = &self.endpoint;
                e.contains('*')
                    || e.contains("::")
                    || e.starts_with("ipc://")
                    || e.starts_with("inproc://")
            }
        }
    }
}

#[derive(Debug, Error)]
pub enum KvEventsError {
    #[error("cannot bind KV-event socket {endpoint}")]
    Bind {
        endpoint: String,
        #[source]
        source: zeromq::ZmqError,
    },
}

/// msgpack writer over a `Vec<u8>`; writing to memory cannot fail, so the
/// `io::Result`s of `rmp` are discarded here and only here.
struct Pack(Vec<u8>);

impl Pack {
    fn array(&mut self, n: usize) {
        let _ = rmp::encode::write_array_len(&mut self.0, n as u32);
    }
    fn map(&mut self, n: usize) {
        let _ = rmp::encode::write_map_len(&mut self.0, n as u32);
    }
    fn str(&mut self, s: &str) {
        let _ = rmp::encode::write_str(&mut self.0, s);
    }
    fn uint(&mut self, v: u64) {
        let _ = rmp::encode::write_uint(&mut self.0, v);
    }
    fn nil(&mut self) {
        let _ = rmp::encode::write_nil(&mut self.0);
    }
    fn opt_uint(&mut self, v: Option<u64>) {
        match v {
            Some(v) => self.uint(v),
            None => self.nil(),
        }
    }
    fn opt_str(&mut self, v: Option<&str>) {
        match v {
            Some(v) => self.str(v),
            None => self.nil(),
        }
    }
    fn uints(&mut self, vs: impl ExactSizeIterator<Item = u64>) {
        self.array(vs.len());
        vs.for_each(|v| self.uint(v));
    }
}

/// Encodes one `EventBatch` payload.
pub fn encode_batch(ts: f64, events: &[KvEvent], encoding: EventEncoding, dp_rank: u32) -> Vec<u8> {
    let mut p = Pack(Vec::with_capacity(64 + events.len() * 96));
    p.array(3);
    let _ = rmp::encode::write_f64(&mut p.0, ts);
    p.array(events.len());
    for event in events {
        match encoding {
            EventEncoding::Array => positional(&mut p, event),
            EventEncoding::Map => keyed(&mut p, event),
        }
    }
    p.uint(u64::from(dp_rank));
    p.0
}

fn positional(p: &mut Pack, event: &KvEvent) {
    match event {
        KvEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_id,
            lora_name,
        } => {
            // msgspec omit_defaults drops a trailing `lora_name = None`.
            p.array(if lora_name.is_some() { 8 } else { 7 });
            p.str("BlockStored");
            p.uints(block_hashes.iter().copied());
            p.opt_uint(*parent_block_hash);
            p.uints(token_ids.iter().map(|&t| u64::from(t)));
            p.uint(*block_size as u64);
            p.opt_uint(*lora_id);
            p.str("GPU");
            if let Some(name) = lora_name {
                p.str(name);
            }
        }
        KvEvent::BlockRemoved { block_hashes } => {
            p.array(3);
            p.str("BlockRemoved");
            p.uints(block_hashes.iter().copied());
            p.str("GPU");
        }
        KvEvent::AllBlocksCleared => {
            p.array(1);
            p.str("AllBlocksCleared");
        }
    }
}

fn keyed(p: &mut Pack, event: &KvEvent) {
    match event {
        KvEvent::BlockStored { .. } => keyed_stored(p, event),
        KvEvent::BlockRemoved { block_hashes } => {
            p.map(3);
            p.str("type");
            p.str("BlockRemoved");
            p.str("block_hashes");
            p.uints(block_hashes.iter().copied());
            p.str("medium");
            p.str("GPU");
        }
        KvEvent::AllBlocksCleared => {
            p.map(1);
            p.str("type");
            p.str("AllBlocksCleared");
        }
    }
}

/// BlockStored as a map, in the field order of vLLM's wire test.
fn keyed_stored(p: &mut Pack, event: &KvEvent) {
    let KvEvent::BlockStored {
        block_hashes,
        parent_block_hash,
        token_ids,
        block_size,
        lora_id,
        lora_name,
    } = event
    else {
        return;
    };
    p.map(11);
    p.str("type");
    p.str("BlockStored");
    p.str("block_hashes");
    p.uints(block_hashes.iter().copied());
    p.str("parent_block_hash");
    p.opt_uint(*parent_block_hash);
    p.str("token_ids");
    p.uints(token_ids.iter().map(|&t| u64::from(t)));
    p.str("block_size");
    p.uint(*block_size as u64);
    p.str("lora_id");
    p.opt_uint(*lora_id);
    p.str("medium");
    p.str("GPU");
    p.str("lora_name");
    p.opt_str(lora_name.as_deref());
    // One entry per block: `(lora_name,)` or None.
    p.str("extra_keys");
    p.array(block_hashes.len());
    for _ in block_hashes {
        match lora_name {
            Some(name) => {
                p.array(1);
                p.str(name);
            }
            None => p.nil(),
        }
    }
    p.str("group_idx");
    p.uint(0);
    p.str("kv_cache_spec_kind");
    p.str("full_attention");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }

    fn stored() -> KvEvent {
        KvEvent::BlockStored {
            block_hashes: vec![8866452693264111234],
            parent_block_hash: None,
            token_ids: (1..=16).collect(),
            block_size: 16,
            lora_id: None,
            lora_name: None,
        }
    }

    #[test]
    fn positional_block_stored_matches_the_reference_bytes() {
        let got = encode_batch(1700000000.5, &[stored()], EventEncoding::Array, 0);
        let want = "93cb41d954fc402000009197ab426c6f636b53746f72656491cf7b0bf7bf7fd01682c0dc00100102030405060708090a0b0c0d0e0f1010c0a347505500";
        assert_eq!(hex(&got), want);
    }

    #[test]
    fn map_block_stored_matches_the_reference_bytes() {
        let got = encode_batch(1700000000.5, &[stored()], EventEncoding::Map, 0);
        let want = "93cb41d954fc40200000918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cf7b0bf7bf7fd01682b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc00100102030405060708090a0b0c0d0e0f10aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797391c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00";
        assert_eq!(hex(&got), want);
    }

    #[test]
    fn removed_and_cleared_match_the_reference_bytes() {
        let events = [
            KvEvent::BlockRemoved {
                block_hashes: vec![8866452693264111234],
            },
            KvEvent::AllBlocksCleared,
        ];
        let got = encode_batch(1700000001.0, &events, EventEncoding::Array, 0);
        let want = "93cb41d954fc404000009293ac426c6f636b52656d6f76656491cf7b0bf7bf7fd01682a347505591b0416c6c426c6f636b73436c656172656400";
        assert_eq!(hex(&got), want);
    }

    #[test]
    fn endpoints_bind_or_connect_by_vllms_rule() {
        let cfg = |endpoint: &str| KvEventsConfig {
            endpoint: endpoint.into(),
            mode: SocketMode::Auto,
            replay_endpoint: None,
            topic: String::new(),
            encoding: EventEncoding::Array,
            buffer_steps: 10,
            dp_rank: 0,
        };
        assert!(cfg("tcp://*:5557").binds());
        assert!(!cfg("tcp://127.0.0.1:5557").binds());
        assert!(cfg("ipc:///tmp/x").binds());
    }
}
