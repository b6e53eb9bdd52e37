//! gRPC bodies as the gRPC parsers read them (`vertexai-parser`, `vllmgrpc-parser`): one
//! message framed as gRPC does (a compression flag, a big-endian length), and the few protobuf
//! wire rules their messages need (varints, length-delimited fields, packed and unpacked
//! repeated varints; fixed-width fields are skipped). A malformed message is refused.

use super::RequestError;
use std::ops::Range;

/// The gRPC message header: a compression flag and a big-endian length.
pub(crate) const FRAME_HEADER: usize = 5;

/// The first gRPC message of `body` (upstream's `ParseGrpcPayload`).
pub(crate) fn unframe(body: &[u8]) -> Result<&[u8], RequestError> {
    let header = body
        .get(..FRAME_HEADER)
        .ok_or(RequestError::GrpcFrame("shorter than the 5-byte header"))?;
    if header[0] == 1 {
        return Err(RequestError::GrpcFrame(
            "compressed gRPC payload is not supported",
        ));
    }
    let len = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    body.get(FRAME_HEADER..FRAME_HEADER.saturating_add(len))
        .ok_or(RequestError::GrpcFrame("incomplete gRPC payload"))
}

/// A protobuf message that does not follow the wire format.
#[derive(Debug)]
pub(crate) struct Malformed;

/// The last occurrence of length-delimited field `number` in `message` (protobuf: the last
/// value of a non-repeated field wins).
pub(crate) fn last_field(message: &[u8], number: u64) -> Result<Option<&[u8]>, Malformed> {
    let mut at = 0;
    let mut found = None;
    while at < message.len() {
        let key = varint(message, &mut at)?;
        let value = skip(message, &mut at, key & 7)?;
        if key >> 3 == number && key & 7 == 2 {
            found = Some(&message[value]);
        }
    }
    Ok(found)
}

/// Moves past one field's value of wire type `wire`; the range of a length-delimited one.
fn skip(message: &[u8], at: &mut usize, wire: u64) -> Result<Range<usize>, Malformed> {
    let start = *at;
    let end = match wire {
        0 => {
            varint(message, at)?;
            *at
        }
        1 => start + 8,
        2 => {
            let len = usize::try_from(varint(message, at)?).map_err(|_| Malformed)?;
            let from = *at;
            *at = from.checked_add(len).ok_or(Malformed)?;
            if *at > message.len() {
                return Err(Malformed);
            }
            return Ok(from..*at);
        }
        5 => start + 4,
        _ => return Err(Malformed),
    };
    if end > message.len() {
        return Err(Malformed);
    }
    *at = end;
    Ok(start..end)
}

fn varint(message: &[u8], at: &mut usize) -> Result<u64, Malformed> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *message.get(*at).ok_or(Malformed)?;
        *at += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(Malformed)
}

/// One field: (number, wire type, value).
pub(crate) type Field<'a> = (u64, u64, &'a [u8]);

/// Every field of `message`: (number, wire type, value), where the value of a varint field is
/// its own bytes and that of a length-delimited one its contents.
pub(crate) fn fields(message: &[u8]) -> Result<Vec<Field<'_>>, Malformed> {
    let mut at = 0;
    let mut out = Vec::new();
    while at < message.len() {
        let key = varint(message, &mut at)?;
        let value = skip(message, &mut at, key & 7)?;
        out.push((key >> 3, key & 7, &message[value]));
    }
    Ok(out)
}

/// The varint of a varint field's value (as [`fields`] gives it).
pub(crate) fn varint_value(bytes: &[u8]) -> Result<u64, Malformed> {
    varint(bytes, &mut 0)
}

/// The values of repeated varint field `number`, packed or not.
pub(crate) fn repeated_varints(message: &[u8], number: u64) -> Result<Vec<u64>, Malformed> {
    let mut out = Vec::new();
    for (n, wire, value) in fields(message)? {
        match (n == number, wire) {
            (true, 0) => out.push(varint_value(value)?),
            (true, 2) => {
                let mut at = 0;
                while at < value.len() {
                    out.push(varint(value, &mut at)?);
                }
            }
            _ => {}
        }
    }
    Ok(out)
}
