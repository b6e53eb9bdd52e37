//! The chat template epp renders before tokenizing, for the precise prefix index.
//!
//! Why: the precise index keys blocks by the token ids the pods announce in their KV events, so
//! epp's tokens for a request must equal the pod's prompt tokens. For completions that is the
//! prompt text as-is; for chat it is the model's chat template applied to the messages. epp
//! ships one documented template, the one inference-sim uses (and a deployment can give its
//! model an equivalent): each message renders as `<|{role}|>\n{content}\n`, then
//! `<|assistant|>\n` when `add_generation_prompt` (default true). Content given as parts is the
//! concatenation of the parts' `text`. The markers are ordinary text, tokenized with the rest.

use serde::Deserialize;

/// An OpenAI chat body, as far as epp reads it: the template's text and the multimodal parts
/// (`super::multimodal`).
#[derive(Deserialize)]
pub(crate) struct ChatBody {
    pub(crate) messages: Vec<Message>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
}

#[derive(Deserialize)]
pub(crate) struct Message {
    role: String,
    #[serde(default)]
    pub(crate) content: Option<Content>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(crate) enum Content {
    Text(String),
    Parts(Vec<Part>),
}

/// One content part: its text, or the image, video or audio it carries.
#[derive(Deserialize)]
pub(crate) struct Part {
    #[serde(default)]
    text: Option<String>,
    #[serde(default)]
    pub(crate) image_url: Option<Url>,
    #[serde(default)]
    pub(crate) video_url: Option<Url>,
    #[serde(default)]
    pub(crate) audio_url: Option<Url>,
    #[serde(default)]
    pub(crate) input_audio: Option<InlineAudio>,
}

#[derive(Deserialize)]
pub(crate) struct Url {
    pub(crate) url: String,
}

#[derive(Deserialize)]
pub(crate) struct InlineAudio {
    pub(crate) data: String,
}

/// A chat-completions `body`, or `None` when it is not one.
pub(crate) fn parse(body: &[u8]) -> Option<ChatBody> {
    serde_json::from_slice(body).ok()
}

/// The rendered prompt of a chat-completions `body`, or `None` when it has no usable messages.
pub fn render(body: &[u8]) -> Option<String> {
    let chat = parse(body)?;
    let mut out = String::new();
    for m in &chat.messages {
        out.push_str("<|");
        out.push_str(&m.role);
        out.push_str("|>\n");
        match &m.content {
            None => {}
            Some(Content::Text(t)) => out.push_str(t),
            Some(Content::Parts(parts)) => parts
                .iter()
                .filter_map(|p| p.text.as_deref())
                .for_each(|t| out.push_str(t)),
        }
        out.push('\n');
    }
    if chat.add_generation_prompt.unwrap_or(true) {
        out.push_str("<|assistant|>\n");
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_roles_contents_and_the_generation_prompt() {
        let body = br#"{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]}"#;
        assert_eq!(
            render(body).unwrap(),
            "<|system|>\nBe brief.\n<|user|>\nab\n<|assistant|>\n"
        );
        let no_gen =
            br#"{"messages":[{"role":"user","content":"x"}],"add_generation_prompt":false}"#;
        assert_eq!(render(no_gen).unwrap(), "<|user|>\nx\n");
        assert!(render(b"{}").is_none());
    }
}
