//! Text ↔ token ids: an HF `tokenizers` tokenizer (from `tokenizer.json`, or built from a
//! GGUF's embedded vocabulary) plus the ChatML / Qwen3 chat template (thinking off) and a raw
//! mode (no template, no BOS) for completion prompts.

pub mod gguf_vocab;

use crate::error::{Error, Result};
use crate::loader::gguf::GgufFile;
use std::path::Path;

/// How a chat message becomes a prompt.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatTemplate {
    /// `<|im_start|>role\n…<|im_end|>\n`, optional default system message; Qwen3 adds an empty
    /// `<think>\n\n</think>\n\n` block after the assistant header (thinking off, reference §1.5).
    ChatMl {
        /// System message inserted when the user gives none.
        default_system: Option<String>,
        /// Qwen3 non-thinking suffix.
        qwen3_no_think: bool,
    },
}

impl ChatTemplate {
    /// Pick the template from a model's Jinja chat template text (as shipped in the GGUF or
    /// `tokenizer_config.json`): ChatML with the family's default system prompt.
    pub fn detect(jinja: Option<&str>) -> ChatTemplate {
        let j = jinja.unwrap_or("");
        let default_system = if j.contains("You are a helpful AI assistant named SmolLM") {
            Some("You are a helpful AI assistant named SmolLM, trained by Hugging Face".to_string())
        } else if j.contains("You are Qwen, created by Alibaba Cloud") {
            Some("You are Qwen, created by Alibaba Cloud. You are a helpful assistant.".to_string())
        } else {
            None
        };
        ChatTemplate::ChatMl { default_system, qwen3_no_think: j.contains("enable_thinking") }
    }

    /// Render one user turn (with the generation prompt).
    pub fn render(&self, user: &str, system: Option<&str>) -> String {
        self.pieces(user, system).into_iter().map(|(text, _)| text).collect()
    }

    /// The rendered turn as pieces in order, each flagged `true` when it is message text (the
    /// system or user message) rather than template markup; [`ChatTemplate::render`] is their
    /// concatenation.
    pub fn pieces<'m>(&'m self, user: &'m str, system: Option<&'m str>) -> Vec<(&'m str, bool)> {
        let mut msgs = Vec::with_capacity(2);
        if let Some(sys) = system {
            msgs.push(Message { role: Role::System, content: sys });
        }
        msgs.push(Message { role: Role::User, content: user });
        self.message_pieces(&msgs)
    }

    /// A conversation (system / user / assistant turns, oldest first) rendered as pieces, with
    /// the generation prompt (the assistant header) at the end: the family's default system
    /// message first when the conversation has none; each piece flagged `true` when it is
    /// message text rather than template markup.
    pub fn message_pieces<'m>(&'m self, messages: &[Message<'m>]) -> Vec<(&'m str, bool)> {
        let ChatTemplate::ChatMl { default_system, qwen3_no_think } = self;
        let mut p = Vec::new();
        if !messages.iter().any(|m| m.role == Role::System) {
            if let Some(sys) = default_system.as_deref() {
                p.extend([("<|im_start|>system\n", false), (sys, true), ("<|im_end|>\n", false)]);
            }
        }
        for m in messages {
            let header = match m.role {
                Role::System => "<|im_start|>system\n",
                Role::User => "<|im_start|>user\n",
                Role::Assistant => "<|im_start|>assistant\n",
            };
            p.extend([(header, false), (m.content, true), ("<|im_end|>\n", false)]);
        }
        p.push(("<|im_start|>assistant\n", false));
        if *qwen3_no_think {
            p.push(("<think>\n\n</think>\n\n", false));
        }
        p
    }
}

/// Who wrote a chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Instructions for the assistant.
    System,
    /// The user's turn.
    User,
    /// An earlier answer of the assistant.
    Assistant,
}

/// One message of a conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Message<'m> {
    /// Its author.
    pub role: Role,
    /// Its text.
    pub content: &'m str,
}

/// A tokenizer with its chat template and stop tokens.
pub struct TextTokenizer {
    inner: tokenizers::Tokenizer,
    /// Chat template.
    pub template: ChatTemplate,
    /// Stop ids (eos, end-of-turn) known to the tokenizer.
    pub stop: Vec<u32>,
}

impl TextTokenizer {
    /// From a GGUF file's embedded vocabulary and chat template.
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let inner = gguf_vocab::tokenizer_from_gguf(g).map_err(|e| Error::file(&g.path, e.to_string()))?;
        let template = ChatTemplate::detect(g.get_str("tokenizer.chat_template").ok());
        let sp = gguf_vocab::special_tokens(g);
        let mut stop: Vec<u32> = [sp.eos, sp.eot].into_iter().flatten().collect();
        stop.dedup();
        let mut t = TextTokenizer { inner, template, stop };
        t.add_named_stop("<|im_end|>");
        Ok(t)
    }

    /// From `tokenizer.json` (and `tokenizer_config.json` for the chat template) in `dir`.
    /// Errors: [`Error::File`] naming `tokenizer.json` when it is missing or invalid.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let tj = dir.join("tokenizer.json");
        #[cfg(not(target_arch = "wasm32"))]
        crate::loader::bytes::regular_file(&tj, "a tokenizer.json")?;
        let json = std::fs::read_to_string(&tj).map_err(|e| Error::file(&tj, format!("cannot read tokenizer: {e}")))?;
        let tc = dir.join("tokenizer_config.json");
        let config = if std::fs::metadata(&tc).is_ok_and(|m| m.is_file()) { std::fs::read_to_string(&tc).ok() } else { None };
        TextTokenizer::from_json(&json, config.as_deref()).map_err(|e| Error::file(&tj, e.to_string()))
    }

    /// From the text of `tokenizer.json` and, optionally, of `tokenizer_config.json` (whose
    /// `chat_template` picks the chat template; unreadable config = no template). The browser
    /// build loads tokenizers this way. Stop tokens: `<|im_end|>`, `<|endoftext|>`, `</s>` when
    /// the vocabulary has them.
    /// Errors: [`Error::Tokenizer`] when `tokenizer_json` is not a valid tokenizer.
    pub fn from_json(tokenizer_json: &str, tokenizer_config_json: Option<&str>) -> Result<Self> {
        check_bpe_merges(tokenizer_json)?;
        let inner: tokenizers::Tokenizer = tokenizer_json.parse().map_err(|e| Error::Tokenizer(format!("cannot load tokenizer.json: {e}")))?;
        let jinja = tokenizer_config_json
            .and_then(|s| serde_json::from_str::<serde_json::Value>(s).ok())
            .and_then(|v| v.get("chat_template").and_then(|x| x.as_str()).map(String::from));
        let mut t = TextTokenizer { inner, template: ChatTemplate::detect(jinja.as_deref()), stop: Vec::new() };
        for name in ["<|im_end|>", "<|endoftext|>", "</s>"] {
            t.add_named_stop(name);
        }
        Ok(t)
    }

    fn add_named_stop(&mut self, name: &str) {
        if let Some(id) = self.inner.token_to_id(name) {
            if !self.stop.contains(&id) {
                self.stop.push(id);
            }
        }
    }

    /// Encode text as-is: no template, no BOS; special-token strings map to their ids.
    pub fn encode_raw(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, false).map_err(|e| Error::Tokenizer(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Encode one chat turn with the template (no BOS: ChatML models do not use one). The
    /// message text is data: a control-token string typed in it (`<|im_end|>`, `<|im_start|>`)
    /// is encoded as ordinary text, never as the control token, so a message cannot end its
    /// own turn or forge another role's. Messages without such strings encode exactly as the
    /// rendered template does.
    pub fn encode_chat(&self, user: &str, system: Option<&str>) -> Result<Vec<u32>> {
        self.encode_pieces(&self.template.pieces(user, system))
    }

    /// Encode a conversation with the template ([`ChatTemplate::message_pieces`]), message
    /// text as data exactly as [`TextTokenizer::encode_chat`] encodes it. Errors: tokenizer
    /// failures.
    pub fn encode_messages(&self, messages: &[Message<'_>]) -> Result<Vec<u32>> {
        self.encode_pieces(&self.template.message_pieces(messages))
    }

    fn encode_pieces(&self, pieces: &[(&str, bool)]) -> Result<Vec<u32>> {
        let specials: Vec<String> = self.inner.get_added_tokens_decoder().into_values().filter(|t| t.special).map(|t| t.content).collect();
        let forged = pieces.iter().any(|&(text, message)| message && specials.iter().any(|sp| text.contains(sp.as_str())));
        if !forged {
            let rendered: String = pieces.iter().map(|&(text, _)| text).collect();
            return self.encode_raw(&rendered);
        }
        let mut literal = self.inner.clone();
        literal.set_encode_special_tokens(true);
        let mut ids = Vec::new();
        for &(text, message) in pieces {
            let t = if message { &literal } else { &self.inner };
            ids.extend_from_slice(t.encode(text, false).map_err(|e| Error::Tokenizer(e.to_string()))?.get_ids());
        }
        Ok(ids)
    }

    /// Decode ids to text (special tokens kept visible only if `keep_special`).
    pub fn decode(&self, ids: &[u32], keep_special: bool) -> Result<String> {
        self.inner.decode(ids, !keep_special).map_err(|e| Error::Tokenizer(e.to_string()))
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// Incremental detokenizer for streaming output: each [`TextStream::push`] returns only the text
/// the new ids add, decoding a short window of recent ids instead of the whole output (the
/// window starts one complete step back, so context-dependent decoding — a stripped leading
/// space, a multi-token UTF-8 character — comes out as in a decode of everything). The complete
/// characters of a push go out at once; an incomplete UTF-8 tail (decoded as U+FFFD) is held
/// back until a later push completes it, and [`TextStream::finish`] returns what is still held
/// at the end (an answer cut inside a character ends as the full decode ends: in U+FFFD). The
/// pushes plus `finish` equal `decode(all ids)` for the byte-level BPE vocabularies the engine
/// loads, however the ids are chunked (a speculative round commits several at once).
#[derive(Debug, Clone, Default)]
pub struct TextStream {
    ids: Vec<u32>,
    /// Start of the decoded window in `ids`.
    prefix: usize,
    /// Bytes of `decode(ids[prefix..])` already returned.
    emitted: usize,
    /// End of the ids of the last push whose decode was complete (the next window's start).
    complete: usize,
}

impl TextStream {
    /// An empty stream.
    pub fn new() -> TextStream {
        TextStream::default()
    }

    /// Append `new` ids; returns the text they add (possibly empty). Errors: decoding failures.
    pub fn push(&mut self, tok: &TextTokenizer, new: &[u32]) -> Result<String> {
        self.ids.extend_from_slice(new);
        let text = tok.decode(&self.ids[self.prefix..], false)?;
        let stable = text.trim_end_matches('\u{FFFD}');
        let out = stable.get(self.emitted..).unwrap_or_default().to_string();
        self.emitted = self.emitted.max(stable.len());
        if stable.len() == text.len() {
            // Everything so far is complete: the window restarts one complete push back.
            self.prefix = self.complete;
            self.complete = self.ids.len();
            self.emitted = tok.decode(&self.ids[self.prefix..], false)?.len();
        }
        Ok(out)
    }

    /// What is still held back at the end of the output (an incomplete UTF-8 tail, decoded as
    /// the full decode decodes it); empty when everything went out. Errors: decoding failures.
    pub fn finish(&mut self, tok: &TextTokenizer) -> Result<String> {
        let text = tok.decode(&self.ids[self.prefix..], false)?;
        let out = text.get(self.emitted..).unwrap_or_default().to_string();
        self.emitted = self.emitted.max(text.len());
        Ok(out)
    }
}

/// A BPE model's merges must join tokens of its vocabulary into a token of its vocabulary: the
/// `tokenizers` crate accepts other merges at load and then panics while encoding.
/// Checked on the JSON before loading; errors name the merge.
fn check_bpe_merges(tokenizer_json: &str) -> Result<()> {
    let Ok(v) = serde_json::from_str::<serde_json::Value>(tokenizer_json) else { return Ok(()) }; // the loader reports bad JSON
    let model = &v["model"];
    if model["type"].as_str() != Some("BPE") {
        return Ok(());
    }
    let Some(vocab) = model["vocab"].as_object() else { return Ok(()) };
    let Some(merges) = model["merges"].as_array() else { return Ok(()) };
    for (i, m) in merges.iter().enumerate() {
        let (a, b) = match m {
            serde_json::Value::String(s) => match s.split_once(' ') {
                Some((a, b)) => (a.to_string(), b.to_string()),
                None => return Err(Error::Tokenizer(format!("cannot load tokenizer.json: merge {i} `{s}` is not two tokens"))),
            },
            serde_json::Value::Array(p) if p.len() == 2 => (p[0].as_str().unwrap_or_default().to_string(), p[1].as_str().unwrap_or_default().to_string()),
            _ => return Err(Error::Tokenizer(format!("cannot load tokenizer.json: merge {i} is not a pair of tokens"))),
        };
        let joined = format!("{a}{b}");
        for t in [&a, &b, &joined] {
            if !vocab.contains_key(t.as_str()) {
                let msg = format!("cannot load tokenizer.json: merge {i} (`{a}` + `{b}`) uses `{t}`, which is not in the vocabulary");
                return Err(Error::Tokenizer(msg));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chatml_smollm_default_system() {
        let t = ChatTemplate::detect(Some("... You are a helpful AI assistant named SmolLM, trained by Hugging Face ..."));
        assert_eq!(
            t.render("Hi", None),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn qwen3_thinking_off() {
        let t = ChatTemplate::detect(Some("{%- if enable_thinking is defined and enable_thinking is false %}"));
        assert_eq!(t.render("Hi", None), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    }
}
