use super::*;

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

const H: u64 = 8866452693264111234;

fn stored_1_to_16() -> KvEvent {
    KvEvent::BlockStored {
        block_hashes: vec![H],
        parent_block_hash: None,
        token_ids: (1..=16).collect(),
        block_size: 16,
        lora_name: None,
        medium: Some("GPU".into()),
    }
}

#[test]
fn decodes_the_reference_positional_bytes() {
    let b = decode_batch(&unhex("93cb41d954fc402000009197ab426c6f636b53746f72656491cf7b0bf7bf7fd01682c0dc00100102030405060708090a0b0c0d0e0f1010c0a347505500")).unwrap();
    assert_eq!(
        b,
        EventBatch {
            ts: 1700000000.5,
            events: vec![stored_1_to_16()],
            dp_rank: Some(0)
        }
    );
}

#[test]
fn decodes_the_reference_map_bytes() {
    let hex = "93cb41d954fc40200000918ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657391cf7b0bf7bf7fd01682b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473dc00100102030405060708090a0b0c0d0e0f10aa626c6f636b5f73697a6510a76c6f72615f6964c0a66d656469756da3475055a96c6f72615f6e616d65c0aa65787472615f6b65797391c0a967726f75705f69647800b26b765f63616368655f737065635f6b696e64ae66756c6c5f617474656e74696f6e00";
    let b = decode_batch(&unhex(hex)).unwrap();
    assert_eq!(b.events, vec![stored_1_to_16()]);
}

#[test]
fn decodes_removed_and_cleared() {
    let b = decode_batch(&unhex("93cb41d954fc404000009293ac426c6f636b52656d6f76656491cf7b0bf7bf7fd01682a347505591b0416c6c426c6f636b73436c656172656400")).unwrap();
    assert_eq!(
        b.events,
        vec![
            KvEvent::BlockRemoved {
                block_hashes: vec![H],
                medium: Some("GPU".into())
            },
            KvEvent::AllBlocksCleared
        ]
    );
}

#[test]
fn bytes_hashes_take_the_last_eight_bytes_and_trailing_elements_are_ignored() {
    // [0, [["BlockRemoved", [bin(32)], "GPU", 0, "extra"]], 0, "trailing"]
    let mut p = vec![0x94, 0x00, 0x91, 0x95, 0xac];
    p.extend_from_slice(b"BlockRemoved");
    p.extend_from_slice(&[0x91, 0xc4, 32]);
    p.extend_from_slice(&[0xaa; 24]);
    p.extend_from_slice(&H.to_be_bytes());
    p.extend_from_slice(&[0xa3, b'G', b'P', b'U', 0x00, 0xa5]);
    p.extend_from_slice(b"extra");
    p.extend_from_slice(&[0x00, 0xa8]);
    p.extend_from_slice(b"trailing");
    let b = decode_batch(&p).unwrap();
    assert_eq!(
        b.events,
        vec![KvEvent::BlockRemoved {
            block_hashes: vec![H],
            medium: Some("GPU".into())
        }]
    );
}

#[test]
fn unknown_events_are_skipped_and_bad_input_is_an_error() {
    let mut p = vec![0x92, 0x00, 0x91, 0x92, 0xa4];
    p.extend_from_slice(b"Nope");
    p.push(0x80);
    assert_eq!(decode_batch(&p).unwrap().events, vec![KvEvent::Unknown]);
    assert!(matches!(
        decode_batch(&[0x93, 0xcb]),
        Err(DecodeError::Truncated(_))
    ));
    assert!(decode_batch(&[0xc0]).is_err());
    // BlockStored whose token count does not match its blocks.
    let mut p = vec![0x92, 0x00, 0x91, 0x95, 0xab];
    p.extend_from_slice(b"BlockStored");
    p.extend_from_slice(&[0x91, 0x01, 0xc0, 0x91, 0x01, 0x10]);
    assert!(matches!(
        decode_batch(&p),
        Err(DecodeError::TokenCount { .. })
    ));
}
