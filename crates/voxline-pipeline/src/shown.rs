//! Text from outside (a server's answer or error, a model's tokens, a
//! transcript) as the console shows it: control characters escaped, so no
//! escape sequence clears the screen, retitles the window, rings the bell,
//! moves the cursor or fakes a line of voxline's own; and one message held
//! to a length.

use std::borrow::Cow;

/// Most characters of one message from outside shown on the console (an
/// error a server sent, say); the rest is counted, not shown.
pub const MAX_SHOWN_CHARS: usize = 2_000;

/// `text` with every control character (C0, DEL, C1) written as its escape
/// (`\u{1b}`), except a newline and a tab when `lines` allows them (an
/// answer's paragraphs); unchanged when it holds none.
#[must_use]
pub fn escaped(text: &str, lines: bool) -> Cow<'_, str> {
    let keep = |c: char| lines && (c == '\n' || c == '\t');
    if !text.chars().any(|c| c.is_control() && !keep(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() && !keep(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// An answer's text as the console shows it after its `[N] voxline: `
/// prefix: control characters escaped as [`escaped`] does, newlines and
/// tabs kept, and every newline followed by `indent` (as wide as the
/// prefix), so a paragraph of the answer reads as its continuation and no
/// line of it can pass for a line of voxline's own (`[2] you: …`).
#[must_use]
pub fn continued<'a>(text: &'a str, indent: &str) -> Cow<'a, str> {
    let shown = escaped(text, true);
    if !shown.contains('\n') {
        return shown;
    }
    Cow::Owned(shown.replace('\n', &format!("\n{indent}")))
}

/// One line of a message from outside: control characters (newlines too)
/// escaped, and at most [`MAX_SHOWN_CHARS`] characters, the rest counted.
#[must_use]
pub fn one_line(text: &str) -> Cow<'_, str> {
    let n = text.chars().count();
    if n <= MAX_SHOWN_CHARS {
        return escaped(text, false);
    }
    let head: String = text.chars().take(MAX_SHOWN_CHARS).collect();
    Cow::Owned(format!(
        "{}… ({} more characters)",
        escaped(&head, false),
        n - MAX_SHOWN_CHARS
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_as_escapes_and_nothing_else_changes() {
        let hostile = "\x1b[2J\x1b]0;owned\x07ok\r\n[2] voxline: fake\0\u{9b}31m";
        let shown = escaped(hostile, true);
        assert!(
            !shown.chars().any(|c| c.is_control() && c != '\n'),
            "{shown:?}"
        );
        assert!(
            shown.contains("\\u{1b}[2J") && shown.contains("\\u{7}"),
            "{shown:?}"
        );
        assert!(
            shown.contains("ok\\u{d}\n[2] voxline: fake\\u{0}\\u{9b}31m"),
            "{shown:?}"
        );
        let line = one_line(hostile);
        assert!(!line.chars().any(char::is_control), "{line:?}");
        assert!(matches!(
            escaped("Paris, France.\n", true),
            Cow::Borrowed(_)
        ));
        assert!(matches!(one_line("é ✓ 東京"), Cow::Borrowed(_)));
    }

    #[test]
    fn an_answer_s_new_lines_are_indented_so_no_line_passes_for_voxline_s_own() {
        let hostile = "sure\n[2] you: ignore\n[2] voxline: send key\r\x1b[1A";
        let shown = continued(hostile, "             ");
        for line in shown.lines().skip(1) {
            assert!(line.starts_with("             ["), "{line:?}");
        }
        assert!(!shown.chars().any(|c| c.is_control() && c != '\n'));
        assert_eq!(shown.lines().count(), 3);
        assert!(matches!(continued("Paris.", "  "), Cow::Borrowed(_)));
        assert_eq!(continued("a\tb\n", "  "), "a\tb\n  ");
    }

    #[test]
    fn a_long_message_is_cut_and_what_is_left_out_counted() {
        let long = "x".repeat(10_000_000);
        let shown = one_line(&long);
        assert!(shown.len() < MAX_SHOWN_CHARS + 40, "{}", shown.len());
        assert!(shown.ends_with("(9998000 more characters)"), "{shown:.60}");
    }
}
