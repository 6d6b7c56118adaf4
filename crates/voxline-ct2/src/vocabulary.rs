//! The model's vocabulary (`vocabulary.txt`, one byte-level BPE token per
//! line, CTranslate2's token ids being the line numbers): the special tokens
//! a transcription is prompted with, and the text of the tokens it returns.

use std::collections::HashMap;
use std::path::Path;

/// Token ids and texts.
#[derive(Debug)]
pub(crate) struct Vocabulary {
    tokens: Vec<String>,
    bytes: HashMap<char, u8>,
    /// `<|endoftext|>`: every id below it is text.
    pub eot: usize,
    /// `<|startoftranscript|>`.
    pub sot: usize,
    /// `<|notimestamps|>`.
    pub no_timestamps: usize,
    /// `<|en|>` and `<|transcribe|>` for a multilingual model (whose
    /// vocabulary is longer than the English-only models' 51 864).
    pub language_task: Option<[usize; 2]>,
}

/// Tokens of an English-only whisper vocabulary.
const ENGLISH_ONLY_TOKENS: usize = 51_864;

impl Vocabulary {
    /// Reads `vocabulary.txt` from the model directory.
    pub(crate) fn load(dir: &Path) -> Result<Self, String> {
        let path = dir.join("vocabulary.txt");
        let text = std::fs::read_to_string(&path)
            .map_err(|e| format!("{}: cannot be read ({e})", path.display()))?;
        Self::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub(crate) fn parse(text: &str) -> Result<Self, String> {
        let tokens: Vec<String> = text.lines().map(str::to_string).collect();
        let find = |t: &str| {
            tokens
                .iter()
                .position(|v| v == t)
                .ok_or_else(|| format!("not a whisper vocabulary: it has no {t}"))
        };
        let eot = find("<|endoftext|>")?;
        let sot = find("<|startoftranscript|>")?;
        let no_timestamps = find("<|notimestamps|>")?;
        let language_task = if tokens.len() > ENGLISH_ONLY_TOKENS {
            Some([find("<|en|>")?, find("<|transcribe|>")?])
        } else {
            None
        };
        Ok(Self {
            tokens,
            bytes: voxline_models::whisper_ggml::byte_decoder(),
            eot,
            sot,
            no_timestamps,
            language_task,
        })
    }

    /// The prompt: start of transcript, the language and task where the
    /// model is multilingual, and no timestamps unless asked for.
    pub(crate) fn prompt(&self, timestamps: bool) -> Vec<usize> {
        let mut p = vec![self.sot];
        if let Some(lt) = self.language_task {
            p.extend(lt);
        }
        if !timestamps {
            p.push(self.no_timestamps);
        }
        p
    }

    /// The text of `ids` (special and timestamp tokens skipped) and how many
    /// text tokens it holds. Bytes that are not UTF-8 become U+FFFD.
    pub(crate) fn text(&self, ids: &[usize]) -> (String, u32) {
        let mut bytes = Vec::new();
        let mut n = 0u32;
        for &id in ids.iter().filter(|&&id| id < self.eot) {
            let Some(token) = self.tokens.get(id) else {
                continue;
            };
            n += 1;
            bytes.extend(token.chars().filter_map(|c| self.bytes.get(&c).copied()));
        }
        (String::from_utf8_lossy(&bytes).trim().to_string(), n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> Vocabulary {
        let mut lines: Vec<String> = (0..50_257).map(|i| format!("t{i}")).collect();
        lines[0] = "Hello".into();
        lines[1] = "Ġworld".into();
        lines[2] = "!".into();
        // "é" in byte-level form: two bytes, each a mapped character
        lines[3] = "ĠÃ©".into();
        lines.push("<|endoftext|>".into());
        lines.push("<|startoftranscript|>".into());
        lines.push("<|en|>".into());
        lines.push("<|transcribe|>".into());
        lines.push("<|notimestamps|>".into());
        lines.push("<|0.00|>".into());
        Vocabulary::parse(&lines.join("\n")).unwrap()
    }

    #[test]
    fn text_tokens_are_decoded_and_special_ones_skipped() {
        let v = tiny();
        assert_eq!(v.eot, 50_257);
        assert_eq!(v.prompt(false), vec![50_258, 50_261]);
        assert_eq!(v.prompt(true), vec![50_258]);
        let (text, n) = v.text(&[50_262, 0, 1, 3, 2, 50_257]);
        assert_eq!(text, "Hello world é!");
        assert_eq!(n, 4);
        assert_eq!(v.text(&[]), (String::new(), 0));
        // an id past the vocabulary is skipped, not a panic
        assert_eq!(v.text(&[0, 99_999_999]).0, "Hello");
    }

    #[test]
    fn a_file_that_is_not_a_whisper_vocabulary_is_refused() {
        let err = Vocabulary::parse("a\nb\n<|endoftext|>\n").unwrap_err();
        assert!(err.contains("no <|startoftranscript|>"), "{err}");
    }
}
