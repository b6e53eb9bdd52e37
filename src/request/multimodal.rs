//! The multimodal items of an OpenAI chat body: each image, video or audio part, identified by
//! a hash of what names it (its URL, or its inline data), for `mm-embeddings-cache-*`. Two
//! requests carrying the same picture name the same item, so a pod that encoded it once holds
//! its embeddings. The body is read with the chat module's model of it ([`super::chat`]).
//! Upstream identifies an item by its token producer's hash of the same string
//! (the `estimate` backend) or by vLLM's render endpoint; only equality matters here.

use super::chat::{Content, Part};

/// One multimodal item: its modality and the hash of its content reference.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Item {
    pub modality: Modality,
    pub hash: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Modality {
    Image,
    Video,
    Audio,
}

impl Modality {
    pub fn name(self) -> &'static str {
        match self {
            Self::Image => "image",
            Self::Video => "video",
            Self::Audio => "audio",
        }
    }
}

/// The item a content part carries, if any: its modality and what names it.
fn item_of(part: Part) -> Option<(Modality, String)> {
    let Part {
        image_url,
        video_url,
        audio_url,
        input_audio,
        ..
    } = part;
    image_url
        .map(|u| (Modality::Image, u.url))
        .or_else(|| video_url.map(|u| (Modality::Video, u.url)))
        .or_else(|| audio_url.map(|u| (Modality::Audio, u.url)))
        .or_else(|| input_audio.map(|a| (Modality::Audio, a.data)))
}

/// The distinct items of a chat body, in order of first appearance (empty for a body that is
/// not a chat with multimodal parts, or that does not parse).
pub fn items(body: &[u8]) -> Vec<Item> {
    let Some(chat) = super::chat::parse(body) else {
        return Vec::new();
    };
    let parts = chat.messages.into_iter().flat_map(|m| match m.content {
        Some(Content::Parts(p)) => p,
        Some(Content::Text(_)) | None => Vec::new(),
    });
    let mut out: Vec<Item> = Vec::new();
    for (modality, reference) in parts.filter_map(item_of) {
        let item = Item {
            modality,
            hash: xxhash_rust::xxh64::xxh64(reference.as_bytes(), 0),
        };
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(parts: serde_json::Value) -> Vec<u8> {
        serde_json::json!({"model": "m", "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": parts}
        ]})
        .to_string()
        .into_bytes()
    }

    #[test]
    fn each_distinct_image_video_and_audio_part_is_one_item() {
        let b = body(serde_json::json!([
            {"type": "text", "text": "compare"},
            {"type": "image_url", "image_url": {"url": "https://x/a.png"}},
            {"type": "image_url", "image_url": {"url": "https://x/b.png", "detail": "low"}},
            {"type": "image_url", "image_url": {"url": "https://x/a.png"}},
            {"type": "video_url", "video_url": {"url": "https://x/v.mp4"}},
            {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
        ]));
        let got = items(&b);
        let modalities: Vec<Modality> = got.iter().map(|i| i.modality).collect();
        assert_eq!(
            modalities,
            [
                Modality::Image,
                Modality::Image,
                Modality::Video,
                Modality::Audio
            ]
        );
        let again = items(&body(serde_json::json!([
            {"type": "image_url", "image_url": {"url": "https://x/a.png"}}
        ])));
        assert_eq!(again, [got[0]], "the same picture is the same item");
    }

    #[test]
    fn text_bodies_and_bodies_that_do_not_parse_have_none() {
        assert!(items(&body(serde_json::json!("just text"))).is_empty());
        assert!(items(br#"{"model":"m","prompt":"hi"}"#).is_empty());
        assert!(items(b"{not json").is_empty());
        let odd = body(serde_json::json!([{"type": "image_url", "image_url": 7}]));
        assert!(items(&odd).is_empty());
    }
}
