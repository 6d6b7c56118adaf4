//! Cutting a streamed answer into speakable chunks.
//!
//! A chunk ends at a sentence end (`.`, `!`, `?`, or a line break) once the
//! text after it shows it is one (a space or a line break follows, so "3.5"
//! and "e.g." mid-stream are not cut). The first chunk of an answer may end
//! earlier, so the first sound does not wait for a long sentence: at a
//! clause boundary (`,`, `;`, `:`, a dash) after at least
//! [`FIRST_CHUNK_MIN_WORDS`] words, else after [`FIRST_CHUNK_MAX_WORDS`]
//! words (at the space before the next one): the first sound then follows
//! the first words of the answer, a few tokens of decoding. A sentence longer than [`MAX_CHUNK_CHARS`] is cut at its
//! last clause boundary, else its last space. What the model writes for the
//! eye and not the ear (markdown's `*`, `#`, `_`, backticks) is left out.

/// Words the first chunk needs before a clause boundary may end it.
pub const FIRST_CHUNK_MIN_WORDS: usize = 3;

/// Words after which the first chunk ends even without punctuation.
pub const FIRST_CHUNK_MAX_WORDS: usize = 4;

/// The longest chunk: past it a sentence is cut at a clause or a word.
pub const MAX_CHUNK_CHARS: usize = 220;

/// Characters of pending text a cut is looked for in.
const SCAN_CHARS: usize = MAX_CHUNK_CHARS + 64;

/// Cuts one answer, streamed token by token, into chunks to speak.
#[derive(Debug, Default, Clone)]
pub struct Chunker {
    pending: String,
    emitted: usize,
}

fn is_sentence_end(c: char) -> bool {
    matches!(c, '.' | '!' | '?' | '\n')
}

fn is_clause_end(c: char) -> bool {
    matches!(c, ',' | ';' | ':' | '—' | '–')
}

/// Closing marks that belong to the sentence before them.
fn is_closer(c: char) -> bool {
    matches!(c, '"' | '\'' | ')' | ']' | '”' | '’')
}

/// The text as it is spoken: markup dropped, whitespace collapsed.
#[must_use]
pub fn speakable(text: &str) -> String {
    let kept: String = text
        .chars()
        .filter(|c| !matches!(c, '*' | '#' | '_' | '`' | '~'))
        .collect();
    let words = kept.split_whitespace().collect::<Vec<_>>().join(" ");
    // a mark left over from the chunk before (an ellipsis, a dash) is not spoken
    words
        .trim_start_matches(|c: char| {
            matches!(c, '.' | ',' | ';' | ':' | '!' | '?' | '-' | '—' | '–') || c.is_whitespace()
        })
        .to_owned()
}

/// What of an answer a voice left out because it cannot read it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LeftOut {
    /// Characters left out.
    pub chars: usize,
    /// Their scripts, in the order first met.
    pub scripts: Vec<&'static str>,
}

/// The script of `c` when an English voice cannot read it; `None` when it
/// can.
///
/// An English voice reads the Latin script (accented letters included),
/// Greek letters (by their names: "π" is "pi"), digits, punctuation and
/// symbols. Of a letter in any other script espeak-ng's English says only
/// what it is, "Chinese letter", "Ethiopic letter 1 2 3 0", "letter 1 D 4 3
/// 1": 10-35 phonemes a character that tell a listener nothing (660
/// Chinese characters were 257 s of "Chinese letter"). Those letters, and
/// the marks, digits and punctuation of their scripts, are left out.
#[must_use]
pub fn unreadable_in_english(c: char) -> Option<&'static str> {
    let u = u32::from(c);
    let named = match u {
        0x0400..=0x052F | 0x1C80..=0x1C8F | 0x2DE0..=0x2DFF | 0xA640..=0xA69F => "Cyrillic",
        0x0530..=0x058F => "Armenian",
        0x0590..=0x05FF => "Hebrew",
        0x0600..=0x06FF | 0x0750..=0x077F | 0x08A0..=0x08FF | 0xFB50..=0xFDFF | 0xFE70..=0xFEFF => {
            "Arabic"
        }
        0x0900..=0x0DFF => "Indic",
        0x0E00..=0x0EFF => "Thai or Lao",
        0x10A0..=0x10FF => "Georgian",
        0x1100..=0x11FF | 0x3130..=0x318F | 0xAC00..=0xD7AF => "Korean",
        0x1200..=0x139F | 0x2D80..=0x2DDF | 0xAB00..=0xAB2F => "Ethiopic",
        0x3040..=0x30FF | 0x31F0..=0x31FF => "Japanese kana",
        0x3400..=0x4DBF | 0x4E00..=0x9FFF | 0xF900..=0xFAFF | 0x20000..=0x3FFFF => {
            "Chinese characters"
        }
        _ => "",
    };
    if !named.is_empty() {
        return Some(named);
    }
    let latin_or_greek = matches!(
        u,
        0x0000..=0x036F
            | 0x0370..=0x03FF
            | 0x1E00..=0x1FFF
            | 0x2C60..=0x2C7F
            | 0xA720..=0xA7FF
            | 0xAB30..=0xAB6F
            | 0xFB00..=0xFB06
    );
    // a letter or digit of a script not named above (fullwidth and
    // mathematical letters, Roman numerals: espeak-ng says "letter" and
    // their code) is left out too
    (c.is_alphanumeric() && !latin_or_greek).then_some("other scripts")
}

/// `text` with what `unread` names a script of left out, counted in
/// `left_out`: each run of it becomes one space, so the words on either
/// side stay apart.
pub fn leave_out(
    text: &str,
    unread: impl Fn(char) -> Option<&'static str>,
    left_out: &mut LeftOut,
) -> String {
    let mut out = String::with_capacity(text.len());
    let mut in_run = false;
    for c in text.chars() {
        match unread(c) {
            Some(script) => {
                left_out.chars += 1;
                if !left_out.scripts.contains(&script) {
                    left_out.scripts.push(script);
                }
                if !in_run {
                    out.push(' ');
                }
                in_run = true;
            }
            None => {
                out.push(c);
                in_run = false;
            }
        }
    }
    out
}

impl Chunker {
    /// A chunker at the start of an answer.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Chunks emitted so far.
    #[must_use]
    pub fn emitted(&self) -> usize {
        self.emitted
    }

    /// Adds `text` (the next token); returns the chunks it completes, in order.
    pub fn push(&mut self, text: &str) -> Vec<String> {
        self.pending.push_str(text);
        let mut out = Vec::new();
        while let Some(end) = self.cut() {
            let rest = self.pending.split_off(end);
            let chunk = speakable(&std::mem::replace(&mut self.pending, rest));
            if !chunk.is_empty() && chunk.chars().any(char::is_alphanumeric) {
                self.emitted += 1;
                out.push(chunk);
            } else if !chunk.is_empty() {
                // punctuation alone is not spoken; it stays with nothing
            }
        }
        out
    }

    /// The answer ended: the rest, if there is anything to say.
    pub fn finish(&mut self) -> Option<String> {
        let chunk = speakable(&std::mem::take(&mut self.pending));
        if chunk.chars().any(char::is_alphanumeric) {
            self.emitted += 1;
            Some(chunk)
        } else {
            None
        }
    }

    /// Where the pending text may be cut (a byte offset), if anywhere yet.
    fn cut(&self) -> Option<usize> {
        let s = &self.pending;
        // no cut falls past the longest chunk but a sentence's end just
        // after it: the scan is bounded, whatever a token holds
        let chars: Vec<(usize, char)> = s.char_indices().take(SCAN_CHARS).collect();
        let first = self.emitted == 0;
        let mut words = 0usize;
        let mut in_word = false;
        let mut last_clause: Option<usize> = None;
        let mut last_space: Option<usize> = None;
        for (k, &(i, c)) in chars.iter().enumerate() {
            if c.is_alphanumeric() {
                if !in_word {
                    words += 1;
                }
                in_word = true;
            } else {
                in_word = false;
            }
            // a cut for length falls within the longest chunk
            let fits = k < MAX_CHUNK_CHARS;
            if c.is_whitespace() && fits {
                last_space = Some(i);
                // the first chunk: its first words, once the next one begins
                let next_word = chars.get(k + 1).is_some_and(|&(_, n)| !n.is_whitespace());
                if first && words >= FIRST_CHUNK_MAX_WORDS && next_word {
                    return Some(i);
                }
            }
            let terminal = is_sentence_end(c) || is_clause_end(c);
            if !terminal {
                continue;
            }
            // the end of the mark and the closers after it
            let mut j = k + 1;
            while j < chars.len() && (is_closer(chars[j].1) || is_sentence_end(chars[j].1)) {
                j += 1;
            }
            // a boundary only once the next character shows it is one
            let Some(&(next_at, next)) = chars.get(j) else {
                continue;
            };
            if c != '\n' && !next.is_whitespace() {
                continue;
            }
            if is_sentence_end(c) && words > 0 {
                return Some(next_at);
            }
            if is_clause_end(c) {
                if first && words >= FIRST_CHUNK_MIN_WORDS {
                    return Some(next_at);
                }
                if fits {
                    last_clause = Some(next_at);
                }
            }
        }
        if chars.len() > MAX_CHUNK_CHARS {
            // a word longer than a chunk (a server's 10 KB of digits) is cut
            return last_clause
                .or(last_space)
                .filter(|&at| at > 0)
                .or_else(|| chars.get(MAX_CHUNK_CHARS).map(|&(i, _)| i));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(tokens: &[&str]) -> Vec<String> {
        let mut c = Chunker::new();
        let mut out = Vec::new();
        for t in tokens {
            out.extend(c.push(t));
        }
        out.extend(c.finish());
        out
    }

    #[test]
    fn a_word_longer_than_a_chunk_is_cut_into_chunks() {
        for word in ["7".repeat(10_000), "é".repeat(3_000), "ab".repeat(50_000)] {
            let chunks = stream(&[&word, " and then some."]);
            assert!(
                chunks.iter().all(|c| c.chars().count() <= MAX_CHUNK_CHARS),
                "{:?}",
                chunks.iter().map(|c| c.chars().count()).collect::<Vec<_>>()
            );
            let joined: String = chunks.concat();
            assert!(joined.starts_with(&word[..100]), "{joined:.40}");
            assert!(chunks.last().unwrap().ends_with("and then some."));
        }
    }

    #[test]
    fn sentences_become_chunks_once_the_next_token_shows_their_end() {
        let mut c = Chunker::new();
        assert!(c.push("The capital").is_empty());
        assert!(
            c.push(" is Paris.").is_empty(),
            "a dot is no end until a space follows"
        );
        assert_eq!(c.push(" It"), ["The capital is Paris."]);
        assert!(c.push(" is big").is_empty());
        assert_eq!(c.finish().as_deref(), Some("It is big"));
        assert_eq!(c.emitted(), 2);
    }

    #[test]
    fn the_first_chunk_may_end_at_a_clause_the_others_do_not() {
        let chunks = stream(&[
            "Well, ",
            "the moon,",
            " far away, about",
            " 384,400 km, from us. Then,",
            " again, it is ",
            "bright.",
        ]);
        assert_eq!(
            chunks,
            [
                "Well, the moon,",
                "far away, about 384,400 km, from us.",
                "Then, again, it is bright."
            ]
        );
    }

    #[test]
    fn the_first_chunk_is_the_first_words_when_no_clause_ends_them() {
        let mut c = Chunker::new();
        for t in ["The", " capital", " of", " France"] {
            assert!(c.push(t).is_empty(), "the fourth word may go on");
        }
        assert_eq!(c.push(" is"), ["The capital of France"]);
        assert!(
            c.push(" Paris and more words").is_empty(),
            "only the first chunk"
        );
        assert_eq!(c.push(". Yes"), ["is Paris and more words."]);
    }

    #[test]
    fn numbers_and_abbreviations_mid_stream_are_not_cut() {
        assert_eq!(
            stream(&["Yes, it is. ", "It is 3", ".5 degrees", " today."]),
            ["Yes, it is.", "It is 3.5 degrees today."]
        );
        assert_eq!(stream(&["Hi!", "\"", " Yes?"]), ["Hi!\"", "Yes?"]);
    }

    #[test]
    fn markup_and_bare_punctuation_are_not_spoken() {
        assert_eq!(
            stream(&["**Sure**", "! ", "... ", "## Tea is ", "`good`."]),
            ["Sure!", "Tea is good."]
        );
        assert!(stream(&["  ", "...", "\n"]).is_empty());
        assert_eq!(speakable("  a\n\n b  "), "a b");
    }

    #[test]
    fn a_long_sentence_is_cut_at_a_clause_or_a_word() {
        let clause = format!("{} and, {}", "word ".repeat(30), "more ".repeat(20));
        let chunks = stream(&["Hi there. ", &clause, "end."]);
        assert_eq!(chunks[0], "Hi there.");
        assert!(chunks[1].ends_with("and,"), "{chunks:?}");
        assert!(chunks
            .iter()
            .all(|c| c.chars().count() <= MAX_CHUNK_CHARS + 10));
        let words = "word ".repeat(60);
        let chunks = stream(&["One. ", &words]);
        assert!(chunks.len() >= 3, "{chunks:?}");
        assert_eq!(chunks.concat().matches("word").count(), 60);
    }

    #[test]
    fn an_english_voice_leaves_out_the_scripts_it_cannot_read() {
        let en = unreadable_in_english;
        for c in [
            'a', 'é', 'Ø', 'ß', 'ệ', 'π', 'Δ', '7', '%', '™', '→', '😀', '，',
        ] {
            assert_eq!(en(c), None, "{c}");
        }
        for (c, script) in [
            ('中', "Chinese characters"),
            ('ሰ', "Ethiopic"),
            ('ж', "Cyrillic"),
            ('ا', "Arabic"),
            ('한', "Korean"),
            ('か', "Japanese kana"),
            ('Ａ', "other scripts"),
            ('Ⅻ', "other scripts"),
        ] {
            assert_eq!(en(c), Some(script), "{c}");
        }
        let mut left = LeftOut::default();
        let said = leave_out("The word 你好，means hello; ሰላም too.", en, &mut left);
        assert_eq!(said, "The word  ，means hello;   too.");
        assert_eq!(left.chars, 5);
        assert_eq!(left.scripts, ["Chinese characters", "Ethiopic"]);
        // what is left is spoken as before; a text of them alone is not
        assert_eq!(stream(&[&said]), ["The word ，means hello;", "too."]);
        let cjk = leave_out(&"中文".repeat(330), en, &mut left);
        assert!(stream(&[&cjk]).is_empty());
        assert_eq!(left.chars, 665);
    }

    #[test]
    fn line_breaks_end_chunks() {
        assert_eq!(
            stream(&["First line\n", "Second line"]),
            ["First line", "Second line"]
        );
    }
}
