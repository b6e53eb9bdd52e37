//! Decoding of vLLM `KVEventBatch` payloads (msgpack), written against the wire contract rather
//! than a schema library, because the contract is loose on purpose: events are positional arrays
//! (vLLM ≤ 0.23) or maps keyed by `type` (after vLLM PR #42892); hashes are uint64, int64 or
//! 32-byte digests (`VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0`, last 8 bytes big-endian); unknown map
//! keys, unknown event types and trailing array elements must be ignored; the outer batch is an
//! array `[ts, events, dp_rank?]` (a map with `ts`/`events` is accepted too).

use rmp::Marker;

/// One decoded event. Only the GPU tier (or no medium) is indexed; other media are kept so the
/// caller can skip them.
#[derive(Clone, Debug, PartialEq)]
pub enum KvEvent {
    BlockStored {
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: Vec<u32>,
        block_size: usize,
        lora_name: Option<String>,
        medium: Option<String>,
    },
    BlockRemoved {
        block_hashes: Vec<u64>,
        medium: Option<String>,
    },
    AllBlocksCleared,
    /// An event type this decoder does not know (skipped).
    Unknown,
}

#[derive(Clone, Debug, PartialEq)]
pub struct EventBatch {
    pub(crate) ts: f64,
    pub events: Vec<KvEvent>,
    pub dp_rank: Option<u64>,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("payload ends early at byte {0}")]
    Truncated(usize),
    #[error("unexpected msgpack marker {marker:#04x} at byte {at} (wanted {wanted})")]
    Unexpected {
        marker: u8,
        at: usize,
        wanted: &'static str,
    },
    #[error("BlockStored has {tokens} token ids for {blocks} blocks of {block_size}")]
    TokenCount {
        tokens: usize,
        blocks: usize,
        block_size: usize,
    },
}

/// Decodes one payload (frame 2 of a KV-event message).
pub fn decode_batch(payload: &[u8]) -> Result<EventBatch, DecodeError> {
    let mut r = Reader {
        buf: payload,
        pos: 0,
    };
    if let Some(n) = r.try_map_len()? {
        return batch_from_map(&mut r, n);
    }
    let n = r.array_len()?;
    if n < 2 {
        return Err(r.unexpected("a batch of at least 2 elements"));
    }
    let ts = r.float()?;
    let events = events(&mut r)?;
    let dp_rank = if n > 2 { r.opt_uint()? } else { None };
    for _ in 3..n {
        r.skip()?;
    }
    Ok(EventBatch {
        ts,
        events,
        dp_rank,
    })
}

fn batch_from_map(r: &mut Reader<'_>, n: usize) -> Result<EventBatch, DecodeError> {
    let mut batch = EventBatch {
        ts: 0.0,
        events: Vec::new(),
        dp_rank: None,
    };
    for _ in 0..n {
        match r.str()? {
            "ts" => batch.ts = r.float()?,
            "events" => batch.events = events(r)?,
            "data_parallel_rank" => batch.dp_rank = r.opt_uint()?,
            _ => r.skip()?,
        }
    }
    Ok(batch)
}

fn events(r: &mut Reader<'_>) -> Result<Vec<KvEvent>, DecodeError> {
    let n = r.array_len()?;
    let mut out = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        out.push(match r.try_map_len()? {
            Some(fields) => keyed(r, fields)?,
            None => positional(r)?,
        });
    }
    Ok(out)
}

/// `["BlockStored", hashes, parent, tokens, block_size, lora_id, medium, lora_name, …]`,
/// `["BlockRemoved", hashes, medium, …]`, `["AllBlocksCleared", …]`.
fn positional(r: &mut Reader<'_>) -> Result<KvEvent, DecodeError> {
    let n = r.array_len()?;
    if n == 0 {
        return Ok(KvEvent::Unknown);
    }
    let tag = r.str()?;
    let (event, used) = match tag {
        "BlockStored" if n >= 5 => {
            let block_hashes = r.hashes()?;
            let parent_block_hash = r.opt_hash()?;
            let token_ids = r.tokens()?;
            let block_size = r.uint()? as usize;
            let mut used = 5;
            let (mut medium, mut lora_name) = (None, None);
            if n > 5 {
                r.skip()?; // lora_id
                used += 1;
            }
            if n > 6 {
                medium = r.opt_str()?;
                used += 1;
            }
            if n > 7 {
                lora_name = r.opt_str()?;
                used += 1;
            }
            (
                stored(
                    block_hashes,
                    parent_block_hash,
                    token_ids,
                    block_size,
                    lora_name,
                    medium,
                )?,
                used,
            )
        }
        "BlockRemoved" if n >= 2 => {
            let block_hashes = r.hashes()?;
            let medium = if n > 2 { r.opt_str()? } else { None };
            (
                KvEvent::BlockRemoved {
                    block_hashes,
                    medium,
                },
                if n > 2 { 3 } else { 2 },
            )
        }
        "AllBlocksCleared" => (KvEvent::AllBlocksCleared, 1),
        _ => (KvEvent::Unknown, 1),
    };
    for _ in used..n {
        r.skip()?;
    }
    Ok(event)
}

/// The map form: `{"type": …, "block_hashes": …, …}` in any order, unknown keys skipped.
fn keyed(r: &mut Reader<'_>, fields: usize) -> Result<KvEvent, DecodeError> {
    let mut tag = String::new();
    let (mut hashes, mut parent, mut tokens, mut block_size, mut lora_name, mut medium) =
        (Vec::new(), None, Vec::new(), 0, None, None);
    for _ in 0..fields {
        match r.str()? {
            "type" => tag = r.str()?.to_owned(),
            "block_hashes" => hashes = r.hashes()?,
            "parent_block_hash" => parent = r.opt_hash()?,
            "token_ids" => tokens = r.tokens()?,
            "block_size" => block_size = r.uint()? as usize,
            "lora_name" => lora_name = r.opt_str()?,
            "medium" => medium = r.opt_str()?,
            _ => r.skip()?,
        }
    }
    Ok(match tag.as_str() {
        "BlockStored" => stored(hashes, parent, tokens, block_size, lora_name, medium)?,
        "BlockRemoved" => KvEvent::BlockRemoved {
            block_hashes: hashes,
            medium,
        },
        "AllBlocksCleared" => KvEvent::AllBlocksCleared,
        _ => KvEvent::Unknown,
    })
}

fn stored(
    block_hashes: Vec<u64>,
    parent_block_hash: Option<u64>,
    token_ids: Vec<u32>,
    block_size: usize,
    lora_name: Option<String>,
    medium: Option<String>,
) -> Result<KvEvent, DecodeError> {
    // checked: block_size comes off the wire, and a wrapped product could match a bogus count
    if block_size == 0 || block_hashes.len().checked_mul(block_size) != Some(token_ids.len()) {
        return Err(DecodeError::TokenCount {
            tokens: token_ids.len(),
            blocks: block_hashes.len(),
            block_size,
        });
    }
    Ok(KvEvent::BlockStored {
        block_hashes,
        parent_block_hash,
        token_ids,
        block_size,
        lora_name,
        medium,
    })
}

/// A cursor over msgpack bytes with just the reads the schema needs.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn unexpected(&self, wanted: &'static str) -> DecodeError {
        let at = self.pos.saturating_sub(1);
        DecodeError::Unexpected {
            marker: self.buf.get(at).copied().unwrap_or(0),
            at,
            wanted,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.buf.len())
            .ok_or(DecodeError::Truncated(self.pos))?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    fn be(&mut self, n: usize) -> Result<u64, DecodeError> {
        Ok(self
            .take(n)?
            .iter()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    }

    fn peek(&self) -> Result<Marker, DecodeError> {
        self.buf
            .get(self.pos)
            .map(|b| Marker::from_u8(*b))
            .ok_or(DecodeError::Truncated(self.pos))
    }

    fn marker(&mut self) -> Result<Marker, DecodeError> {
        let m = self.peek()?;
        self.pos += 1;
        Ok(m)
    }

    fn array_len(&mut self) -> Result<usize, DecodeError> {
        match self.marker()? {
            Marker::FixArray(n) => Ok(usize::from(n)),
            Marker::Array16 => Ok(self.be(2)? as usize),
            Marker::Array32 => Ok(self.be(4)? as usize),
            _ => Err(self.unexpected("an array")),
        }
    }

    fn try_map_len(&mut self) -> Result<Option<usize>, DecodeError> {
        let n = match self.peek()? {
            Marker::FixMap(n) => usize::from(n),
            Marker::Map16 => {
                return self
                    .marker()
                    .and_then(|_| self.be(2))
                    .map(|n| Some(n as usize))
            }
            Marker::Map32 => {
                return self
                    .marker()
                    .and_then(|_| self.be(4))
                    .map(|n| Some(n as usize))
            }
            _ => return Ok(None),
        };
        self.pos += 1;
        Ok(Some(n))
    }

    fn str(&mut self) -> Result<&'a str, DecodeError> {
        let n = match self.marker()? {
            Marker::FixStr(n) => usize::from(n),
            Marker::Str8 => self.be(1)? as usize,
            Marker::Str16 => self.be(2)? as usize,
            Marker::Str32 => self.be(4)? as usize,
            _ => return Err(self.unexpected("a string")),
        };
        let start = self.pos;
        std::str::from_utf8(self.take(n)?).map_err(|_| DecodeError::Unexpected {
            marker: 0,
            at: start,
            wanted: "UTF-8",
        })
    }

    fn opt_str(&mut self) -> Result<Option<String>, DecodeError> {
        if self.peek()? == Marker::Null {
            self.pos += 1;
            return Ok(None);
        }
        match self.peek()? {
            Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32 => {
                self.str().map(|s| Some(s.to_owned()))
            }
            _ => self.skip().map(|()| None),
        }
    }

    /// An integer as u64 (negative int64 values keep their two's-complement bits, as llm-d does).
    fn uint(&mut self) -> Result<u64, DecodeError> {
        Ok(match self.marker()? {
            Marker::FixPos(n) => u64::from(n),
            Marker::FixNeg(n) => n as i64 as u64,
            Marker::U8 | Marker::I8 => self.be(1)?,
            Marker::U16 => self.be(2)?,
            Marker::U32 => self.be(4)?,
            Marker::U64 | Marker::I64 => self.be(8)?,
            Marker::I16 => self.be(2)? as u16 as i16 as i64 as u64,
            Marker::I32 => self.be(4)? as u32 as i32 as i64 as u64,
            _ => return Err(self.unexpected("an integer")),
        })
    }

    fn opt_uint(&mut self) -> Result<Option<u64>, DecodeError> {
        if self.peek()? == Marker::Null {
            self.pos += 1;
            return Ok(None);
        }
        self.uint().map(Some)
    }

    fn float(&mut self) -> Result<f64, DecodeError> {
        match self.peek()? {
            Marker::F64 => self.marker().and_then(|_| self.be(8)).map(f64::from_bits),
            Marker::F32 => self
                .marker()
                .and_then(|_| self.be(4))
                .map(|b| f64::from(f32::from_bits(b as u32))),
            _ => self.uint().map(|n| n as f64),
        }
    }

    /// A block hash: an integer, or bytes whose last 8 are the big-endian low 64 bits.
    fn hash(&mut self) -> Result<u64, DecodeError> {
        let n = match self.peek()? {
            Marker::Bin8 | Marker::Str8 => self.marker().and_then(|_| self.be(1))? as usize,
            Marker::Bin16 | Marker::Str16 => self.marker().and_then(|_| self.be(2))? as usize,
            Marker::Bin32 | Marker::Str32 => self.marker().and_then(|_| self.be(4))? as usize,
            Marker::FixStr(n) => self.marker().map(|_| usize::from(n))?,
            _ => return self.uint(),
        };
        let bytes = self.take(n)?;
        Ok(bytes[n.saturating_sub(8)..]
            .iter()
            .fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
    }

    fn opt_hash(&mut self) -> Result<Option<u64>, DecodeError> {
        if self.peek()? == Marker::Null {
            self.pos += 1;
            return Ok(None);
        }
        self.hash().map(Some)
    }

    fn hashes(&mut self) -> Result<Vec<u64>, DecodeError> {
        let n = self.array_len()?;
        (0..n).map(|_| self.hash()).collect()
    }

    fn tokens(&mut self) -> Result<Vec<u32>, DecodeError> {
        let n = self.array_len()?;
        (0..n).map(|_| self.uint().map(|t| t as u32)).collect()
    }

    /// Skips one value of any type.
    fn skip(&mut self) -> Result<(), DecodeError> {
        let len = match self.marker()? {
            Marker::FixPos(_) | Marker::FixNeg(_) | Marker::Null | Marker::True | Marker::False => {
                0
            }
            Marker::U8 | Marker::I8 => 1,
            Marker::U16 | Marker::I16 => 2,
            Marker::U32 | Marker::I32 | Marker::F32 => 4,
            Marker::U64 | Marker::I64 | Marker::F64 => 8,
            Marker::FixStr(n) => usize::from(n),
            Marker::Str8 | Marker::Bin8 => self.be(1)? as usize,
            Marker::Str16 | Marker::Bin16 => self.be(2)? as usize,
            Marker::Str32 | Marker::Bin32 => self.be(4)? as usize,
            Marker::FixExt1 => 2,
            Marker::FixExt2 => 3,
            Marker::FixExt4 => 5,
            Marker::FixExt8 => 9,
            Marker::FixExt16 => 17,
            Marker::Ext8 => self.be(1)? as usize + 1,
            Marker::Ext16 => self.be(2)? as usize + 1,
            Marker::Ext32 => self.be(4)? as usize + 1,
            Marker::FixArray(n) => return self.skip_n(usize::from(n)),
            Marker::Array16 => return self.be(2).and_then(|n| self.skip_n(n as usize)),
            Marker::Array32 => return self.be(4).and_then(|n| self.skip_n(n as usize)),
            Marker::FixMap(n) => return self.skip_n(usize::from(n) * 2),
            Marker::Map16 => return self.be(2).and_then(|n| self.skip_n(n as usize * 2)),
            Marker::Map32 => return self.be(4).and_then(|n| self.skip_n(n as usize * 2)),
            Marker::Reserved => return Err(self.unexpected("a msgpack value")),
        };
        self.take(len).map(|_| ())
    }

    fn skip_n(&mut self, n: usize) -> Result<(), DecodeError> {
        (0..n).try_for_each(|_| self.skip())
    }
}

#[cfg(test)]
mod tests;
