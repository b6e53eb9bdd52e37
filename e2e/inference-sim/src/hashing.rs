//! vLLM's `sha256_cbor` prefix-cache block hashing, reproduced bit for bit.
//!
//! Why: a router that indexes KV events (or predicts cache hits) must see the
//! same block hashes a real vLLM run with `--prefix-caching-hash-algo
//! sha256_cbor` would publish; llm-d-inference-sim uses its own FNV keys and so
//! cannot stand in for vLLM here. The algorithm (vllm `kv_cache_utils.py`):
//!
//! ```text
//! NONE_HASH = sha256(cbor(seed))                     seed = PYTHONHASHSEED or "vllm-none-hash"
//! h_i       = sha256(cbor((parent32, tuple(block_tokens), extra_keys | None)))
//! ```
//!
//! Only full blocks are hashed; the full 32-byte digest chains; KV events carry
//! the low 64 bits (the last 8 bytes, big-endian). Extra keys: the LoRA name on
//! every block, `cache_salt` on the first block only. The CBOR encoder below is
//! the canonical subset those tuples need (shortest-form heads).

use sha2::{Digest, Sha256};

/// Default seed of 2026 vLLM when `PYTHONHASHSEED` is unset.
pub const DEFAULT_HASH_SEED: &str = "vllm-none-hash";

/// A full 32-byte block hash (what vLLM chains).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct BlockHash(pub [u8; 32]);

impl BlockHash {
    /// The representation in KV events: the low 64 bits of the digest.
    pub fn to_u64(self) -> u64 {
        let mut tail = [0u8; 8];
        tail.copy_from_slice(&self.0[24..]);
        u64::from_be_bytes(tail)
    }
}

/// One CBOR value of the subset used by vLLM's hashed tuples.
#[derive(Clone, Debug, PartialEq)]
pub enum Cbor<'a> {
    Null,
    Uint(u64),
    Bytes(&'a [u8]),
    Text(&'a str),
    Array(Vec<Cbor<'a>>),
}

fn write_head(out: &mut Vec<u8>, major: u8, n: u64) {
    let m = major << 5;
    match n {
        0..=23 => out.push(m | n as u8),
        24..=0xff => out.extend_from_slice(&[m | 24, n as u8]),
        0x100..=0xffff => {
            out.push(m | 25);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        0x1_0000..=0xffff_ffff => {
            out.push(m | 26);
            out.extend_from_slice(&(n as u32).to_be_bytes());
        }
        _ => {
            out.push(m | 27);
            out.extend_from_slice(&n.to_be_bytes());
        }
    }
}

/// Canonical CBOR encoding (as `cbor2.dumps(obj, canonical=True)` for this subset).
pub fn encode_cbor(value: &Cbor<'_>, out: &mut Vec<u8>) {
    match value {
        Cbor::Null => out.push(0xf6),
        Cbor::Uint(n) => write_head(out, 0, *n),
        Cbor::Bytes(b) => {
            write_head(out, 2, b.len() as u64);
            out.extend_from_slice(b);
        }
        Cbor::Text(s) => {
            write_head(out, 3, s.len() as u64);
            out.extend_from_slice(s.as_bytes());
        }
        Cbor::Array(items) => {
            write_head(out, 4, items.len() as u64);
            for item in items {
                encode_cbor(item, out);
            }
        }
    }
}

fn sha256_cbor(value: &Cbor<'_>) -> BlockHash {
    let mut buf = Vec::with_capacity(64);
    encode_cbor(value, &mut buf);
    BlockHash(Sha256::digest(&buf).into())
}

/// `NONE_HASH`: the parent of a request's first block.
pub fn none_hash(seed: &str) -> BlockHash {
    sha256_cbor(&Cbor::Text(seed))
}

/// Per-request inputs besides the tokens that change block hashes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HashExtras {
    /// LoRA adapter name: `(lora_name,)` on every block.
    pub lora_name: Option<String>,
    /// `cache_salt`: appended to the first block's extra keys only.
    pub cache_salt: Option<String>,
}

impl HashExtras {
    fn keys(&self, first_block: bool) -> Cbor<'_> {
        let mut keys = Vec::new();
        if let Some(name) = &self.lora_name {
            keys.push(Cbor::Text(name));
        }
        if let (true, Some(salt)) = (first_block, &self.cache_salt) {
            keys.push(Cbor::Text(salt));
        }
        if keys.is_empty() {
            Cbor::Null
        } else {
            Cbor::Array(keys)
        }
    }
}

/// Hash of one full block given its parent (vLLM `hash_block_tokens`).
pub fn hash_block(
    parent: BlockHash,
    tokens: &[u32],
    extras: &HashExtras,
    first: bool,
) -> BlockHash {
    let tokens = tokens.iter().map(|&t| Cbor::Uint(u64::from(t))).collect();
    sha256_cbor(&Cbor::Array(vec![
        Cbor::Bytes(&parent.0),
        Cbor::Array(tokens),
        extras.keys(first),
    ]))
}

/// Incrementally hashes the full blocks of a growing token sequence.
///
/// Invariant: `hashes[i]` covers tokens `[i*bs, (i+1)*bs)`; a partial tail is
/// never hashed, and appending tokens extends the chain without rehashing.
#[derive(Clone, Debug)]
pub struct BlockHasher {
    root: BlockHash,
    block_size: usize,
    extras: HashExtras,
    hashes: Vec<BlockHash>,
}

impl BlockHasher {
    pub fn new(root: BlockHash, block_size: usize, extras: HashExtras) -> Self {
        Self {
            root,
            block_size,
            extras,
            hashes: Vec::new(),
        }
    }

    /// Hashes every newly full block of `tokens` (the whole sequence so far).
    pub fn update(&mut self, tokens: &[u32]) {
        let full = tokens.len() / self.block_size;
        while self.hashes.len() < full {
            let i = self.hashes.len();
            let parent = self.hashes.last().copied().unwrap_or(self.root);
            let block = &tokens[i * self.block_size..(i + 1) * self.block_size];
            self.hashes
                .push(hash_block(parent, block, &self.extras, i == 0));
        }
    }

    pub fn hashes(&self) -> &[BlockHash] {
        &self.hashes
    }

    pub fn lora_name(&self) -> Option<&str> {
        self.extras.lora_name.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(h: BlockHash) -> String {
        h.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    fn chain(tokens: &[u32], seed: &str, extras: HashExtras) -> Vec<BlockHash> {
        let mut hasher = BlockHasher::new(none_hash(seed), 16, extras);
        hasher.update(tokens);
        hasher.hashes().to_vec()
    }

    #[test]
    fn cbor_matches_the_reference_example() {
        let zero = [0u8; 32];
        let value = Cbor::Array(vec![
            Cbor::Bytes(&zero),
            Cbor::Array(vec![Cbor::Uint(1), Cbor::Uint(2), Cbor::Uint(300)]),
            Cbor::Null,
        ]);
        let mut out = Vec::new();
        encode_cbor(&value, &mut out);
        let want = format!("835820{}83010219012cf6", "00".repeat(32));
        let got: String = out.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(got, want);
    }

    #[test]
    fn synthetic_vectors_match_vllm() {
        let tokens: Vec<u32> = (1..=48).collect();
        let cases: [(&str, &str, [u64; 3]); 3] = [
            (
                "vllm-none-hash",
                "9bd96a485ad84efdafb72ee48a1d7a69bcead0f8f0433173941b276b9581eef0",
                [
                    8866452693264111234,
                    807986237951177663,
                    10877177626832001922,
                ],
            ),
            (
                "0",
                "4e1195df020de59e0d65a33a4279f1183e7ae4e5d980e309f8b55adff2e61c3e",
                [
                    3236607068019569386,
                    2758186210834249151,
                    5191110061519319221,
                ],
            ),
            (
                "12345",
                "7292412b7aee6c72390673c639cb26bbadd61da0cb7af52fea097bf4c7b340b2",
                [
                    7946494704765058032,
                    12145793040335043204,
                    12205898305926617717,
                ],
            ),
        ];
        for (seed, root, want) in cases {
            assert_eq!(hex(none_hash(seed)), root, "seed {seed}");
            let got: Vec<u64> = chain(&tokens, seed, HashExtras::default())
                .into_iter()
                .map(BlockHash::to_u64)
                .collect();
            assert_eq!(got, want, "seed {seed}");
        }
        let first = chain(&tokens, DEFAULT_HASH_SEED, HashExtras::default())[0];
        assert_eq!(
            hex(first),
            "cd7c51bc5a8fc8643f383a2b9e01522fba7473c669e9270c7b0bf7bf7fd01682"
        );
    }

    const CAPTURED: [u32; 48] = [
        2082, 1113, 2142, 374, 264, 4948, 19128, 323, 7203, 429, 374, 66351, 938, 315, 11198, 323,
        59415, 678, 90505, 11, 54263, 533, 7586, 315, 28922, 13, 1527, 1113, 2142, 6738, 369, 279,
        75345, 315, 279, 1584, 11, 892, 432, 9982, 311, 387, 25165, 11, 76244, 11, 323, 27756,
    ];

    #[test]
    fn captured_vllm_hashes_match_with_and_without_lora() {
        assert_eq!(
            hex(none_hash("42")),
            "9fa6eb003f14425eb9c8e6baacfbcaab26257357b829c7bfa74ffcc4f31c1780"
        );
        let base: Vec<u64> = chain(&CAPTURED, "42", HashExtras::default())
            .into_iter()
            .map(BlockHash::to_u64)
            .collect();
        assert_eq!(
            base,
            [
                17705339885301241772,
                13360521540053240825,
                1652464311825922890
            ]
        );
        let lora = HashExtras {
            lora_name: Some("Alice".into()),
            cache_salt: None,
        };
        let lora: Vec<u64> = chain(&CAPTURED, "42", lora)
            .into_iter()
            .map(BlockHash::to_u64)
            .collect();
        assert_eq!(
            lora,
            [
                9643097150530800701,
                11170191873018355659,
                6527130464540768062
            ]
        );
    }

    #[test]
    fn partial_tail_block_is_never_hashed_and_updates_extend_the_chain() {
        let tokens: Vec<u32> = (1..=47).collect();
        assert_eq!(chain(&tokens, "0", HashExtras::default()).len(), 2);
        let mut hasher = BlockHasher::new(none_hash("0"), 16, HashExtras::default());
        hasher.update(&tokens[..20]);
        hasher.update(&(1..=48).collect::<Vec<u32>>());
        assert_eq!(hasher.hashes()[2].to_u64(), 5191110061519319221);
    }

    #[test]
    fn cache_salt_changes_only_the_first_block_key() {
        let tokens: Vec<u32> = (1..=32).collect();
        let salted = HashExtras {
            lora_name: None,
            cache_salt: Some("s".into()),
        };
        let a = chain(&tokens, "0", HashExtras::default());
        let b = chain(&tokens, "0", salted);
        assert_ne!(a[0], b[0]);
        // The second block differs only through its parent.
        let manual = hash_block(b[0], &tokens[16..], &HashExtras::default(), false);
        assert_eq!(manual, b[1]);
    }
}
