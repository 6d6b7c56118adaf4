//! A second opinion from the words: whether a transcript reads as a
//! finished sentence.
//!
//! The audio model hears how a pause sounds; it cannot read. A flat
//! synthetic question, or a reader whose sentence ends keep a continuation
//! pitch, sounds unfinished, and a pause after "ask not" sounds final. The
//! speculative attempt's transcript exists within about a second of the
//! pause on a 2-core CPU (sooner on a GPU), and whisper writes it with
//! punctuation, so its last mark and last word say a good deal: a
//! sentence ending in a full stop, a question mark or an exclamation mark
//! whose last word can end a sentence is *complete*; one ending in a
//! comma, a dash, an ellipsis, or on a word that cannot end one ("and",
//! "the", "of", "um") is a *fragment*; nothing but numbers in digits is
//! a *number* (a group of one read aloud, or the whole of it: what
//! follows says which); anything else (no words, an annotation of a
//! sound, no final mark) the words cannot tell.

/// What the words of a transcript say about the end of the turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WordsVerdict {
    /// A finished sentence.
    Complete,
    /// The words stop in the middle of something.
    Fragment,
    /// Nothing but numbers in digits ("1.", "2, 3", "0 7 9 1"): a group of
    /// a number read aloud (a phone number, a code), whisper ending each
    /// group with a stop whether or not the string goes on, or the whole
    /// of it ("1, 2, 3."). Final unless what follows is more of the number,
    /// in digits or in number words ([`goes_on`]).
    Number,
    /// Words with no final mark and nothing that needs more after them
    /// ("7F Clubs", "what is the capital of France"): whisper left the
    /// sentence open, or wrote a short or unclear one without its stop.
    /// Not an end by itself, but speech that follows is weighed as after a
    /// finished sentence ([`WordsVerdict::may_hold`]).
    Unmarked,
    /// The words cannot tell (no words, a sound's annotation).
    Unknown,
}

impl WordsVerdict {
    /// Whether the turn may end on these words, what follows permitting:
    /// a finished sentence, or a number whose next group may not come.
    #[must_use]
    pub fn may_end(self) -> bool {
        matches!(self, Self::Complete | Self::Number)
    }

    /// Whether a turn already ended (by the pause) on these words is held,
    /// not taken back at once, when its speaker goes on: what follows
    /// decides ([`goes_on`], [`heard_as_one`]). A turn that may end, and
    /// one whose words have no final mark: heard alone a short sentence
    /// may lack its stop ("7F Clubs" for "Seven of clubs."), and joining
    /// it to the next sentence at once makes two sentences one turn.
    #[must_use]
    pub fn may_hold(self) -> bool {
        self.may_end() || self == Self::Unmarked
    }
}

/// Words after which no sentence ends, whatever mark whisper put after
/// them: articles, conjunctions, possessives, fillers, and the
/// prepositions and verbs that need what follows them even in a question.
const NEVER_LAST: &[&str] = &[
    "a", "an", "the", "and", "or", "but", "nor", "so", "because", "although", "though", "unless",
    "until", "whereas", "whether", "if", "than", "my", "your", "our", "their", "his", "its", "um",
    "uh", "er", "erm", "hmm", "uhm", "mm", "like", "very", "really", "just", "then", "also",
    "plus", "versus",
];

/// Words after which a statement does not end but a question may ("Where
/// are you from?", "What is the moon made of?", "Who did you talk to?").
/// Subject pronouns are here, but not "you", which is an object as often
/// ("Thank you.", "… what your country can do for you.").
const NOT_LAST_IN_A_STATEMENT: &[&str] = &[
    "of", "to", "in", "on", "at", "for", "with", "from", "by", "about", "into", "onto", "over",
    "under", "between", "through", "after", "before", "during", "without", "within", "is", "are",
    "was", "were", "be", "been", "am", "will", "would", "can", "could", "should", "shall", "must",
    "might", "may", "have", "has", "had", "do", "does", "did", "that", "which", "who", "whose",
    "when", "where", "while", "what", "how", "why", "i", "we", "they", "he", "she",
];

/// Whether `text` (a transcript) reads as a finished sentence.
#[must_use]
pub fn sentence_end(text: &str) -> WordsVerdict {
    let t = text
        .trim()
        .trim_end_matches(['"', '\'', ')', ']', '»', '”', '’'])
        .trim_end();
    if t.is_empty() || voxline_core::non_speech(t) || t.starts_with('[') {
        return WordsVerdict::Unknown;
    }
    if digits_only(t) {
        return WordsVerdict::Number;
    }
    if t.ends_with("...") || t.ends_with('…') {
        return WordsVerdict::Fragment;
    }
    let Some(mark) = t.chars().last() else {
        return WordsVerdict::Unknown;
    };
    if matches!(mark, ',' | ';' | ':' | '-' | '–' | '—') {
        return WordsVerdict::Fragment;
    }
    let last = t
        .split_whitespace()
        .last()
        .unwrap_or_default()
        .trim_matches(|c: char| !c.is_alphanumeric() && c != '\'')
        .to_lowercase();
    if last.is_empty() {
        return WordsVerdict::Unknown;
    }
    let question = mark == '?';
    let never = NEVER_LAST.contains(&last.as_str())
        || (!question && NOT_LAST_IN_A_STATEMENT.contains(&last.as_str()));
    match mark {
        '.' | '?' | '!' if never => WordsVerdict::Fragment,
        '.' | '?' | '!' => WordsVerdict::Complete,
        _ if NEVER_LAST.contains(&last.as_str()) => WordsVerdict::Fragment,
        _ => WordsVerdict::Unmarked,
    }
}

/// Whether `after` (the transcript of speech that resumed after a pause)
/// goes on with the sentence of `before` (the transcript up to the pause),
/// though `before` reads as finished.
///
/// whisper writes the first word of what it hears with a capital when
/// the audio sounds like the start of a sentence, and in lower case when
/// it starts in the middle of one ("and we are glad to welcome his
/// gospel.", "bread and a bag of rice."), so a first letter in lower case,
/// or a leading ellipsis, goes on; a number that goes on in digits, or
/// in number words alone, after one that ended `before` ("My number is
/// 415." then "238-9901.", "7, 7." then "Three, one.") is the same number
/// read in groups; and a phrase of one or two words that is not a reply
/// or a request of its own ("Milk.", "10 meters." after "Go forward.",
/// "At three." after "The meeting is on Tuesday.") is the next item of
/// what `before` said, whisper having capitalised it for the pause.
#[must_use]
pub fn goes_on(before: &str, after: &str) -> bool {
    if voxline_core::non_speech(after) {
        return false;
    }
    let after = after.trim().trim_start_matches(['"', '\'', '«', '“', '‘']);
    if after.starts_with("...") || after.starts_with('…') {
        return true;
    }
    let Some(first) = after.chars().find(|c| c.is_alphanumeric()) else {
        return false;
    };
    if first.is_lowercase() || more_of_the_number(before, after) {
        return true;
    }
    a_phrase_of_what_went_before(after)
}

/// Whether `before` asks a question: whisper ended it with a question
/// mark. A question is a request of its own; what follows it goes on with
/// it only if its words show that ([`goes_on`]), and is not heard whole
/// with it to find out: that costs one more recognition (about 0.9 s
/// before the next question's answer can begin on 2 cores), and of the
/// pause clips none whose first part whisper ended with a question mark
/// was one sentence heard whole.
#[must_use]
pub fn asks(before: &str) -> bool {
    before.trim_end().ends_with('?')
}

/// As [`goes_on`], for speech that came over the turn's voice, where a
/// wrong yes takes back an answer the user has begun to hear: only a
/// clause that begins, in lower case, with a word that joins it to what
/// went before ("and we are glad …", "because …"; whisper also writes
/// "go forward 10 meters." in lower case after "7 of clubs."), or more of
/// the same number.
#[must_use]
pub fn goes_on_over_its_voice(before: &str, after: &str) -> bool {
    if voxline_core::non_speech(after) {
        return false;
    }
    let joined = after.split_whitespace().next().is_some_and(|w| {
        let w = w.trim_matches(|c: char| !c.is_alphanumeric());
        w.starts_with(char::is_lowercase) && JOINING.contains(&w)
    });
    joined || more_of_the_number(before, after)
}

/// Words that join a clause to the sentence before it, rarely starting a
/// request of their own.
const JOINING: &[&str] = &[
    "and", "or", "but", "nor", "because", "although", "though", "unless", "until", "whereas",
    "whether", "than", "which", "whose", "while", "plus",
];

/// Whether `after` is more of the number `before` ended with: whisper
/// writes a group in digits or in words as it likes ("7, 7." then "Three,
/// one."); a number word may also start a new sentence ("One more
/// thing."), so in words the group must be all numbers.
fn more_of_the_number(before: &str, after: &str) -> bool {
    let last = before.split_whitespace().rev().find_map(|w| {
        Some(w.trim_matches(|c: char| !c.is_alphanumeric())).filter(|w| !w.is_empty())
    });
    let mut words = after
        .split_whitespace()
        .map(|w| w.trim_matches(|c: char| !c.is_alphanumeric()))
        .filter(|w| !w.is_empty())
        .peekable();
    let digit = words
        .peek()
        .is_some_and(|w| w.starts_with(|c: char| c.is_ascii_digit()));
    last.is_some_and(a_number) && (digit || words.all(a_number))
}

/// Words that make a reply or a request of their own, however short
/// ("Thank you.", "Stop.", "No.").
const ON_ITS_OWN: &[&str] = &[
    "yes", "yeah", "yep", "no", "nope", "okay", "ok", "thanks", "thank", "please", "stop", "wait",
    "cancel", "sorry", "hello", "hi", "hey", "bye", "goodbye", "never", "help", "what", "why",
    "how", "who", "where", "when", "which", "really", "right", "sure", "great", "good", "fine",
    "cool", "repeat", "again", "continue", "go",
];

/// Whether `after` is a phrase of one or two words, stated (ending in a
/// full stop: not a question, an exclamation, a trailing ellipsis or no
/// mark), none of which makes a reply or a request of its own, and not a
/// number alone.
fn a_phrase_of_what_went_before(after: &str) -> bool {
    // whisper ends a phrase it hears as said with a full stop; no mark is
    // often a guess at a sound ("7F Clopes")
    let t = after.trim_end();
    if !t.ends_with('.') || t.ends_with("..") {
        return false;
    }
    let words: Vec<String> = t
        .split_whitespace()
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric() && c != '\'')
                .to_lowercase()
        })
        .filter(|w| !w.is_empty())
        .collect();
    (1..=2).contains(&words.len())
        && !words.iter().any(|w| ON_ITS_OWN.contains(&w.as_str()))
        // a number alone after words ("7." after "… young man.") is the
        // start of what comes next as often as an item of what went before
        && !words.iter().all(|w| a_number(w))
}

/// Numbers said as words, as whisper writes a group of a number read
/// aloud when it does not write digits.
const NUMBER_WORDS: &[&str] = &[
    "zero",
    "oh",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
    "thirty",
    "forty",
    "fifty",
    "sixty",
    "seventy",
    "eighty",
    "ninety",
    "hundred",
    "thousand",
    "double",
    "triple",
];

/// Whether `word` (punctuation trimmed) is a number: in digits ("415",
/// "238-9901") or a number word ("Three").
fn a_number(word: &str) -> bool {
    word.chars().next().is_some_and(|c| c.is_ascii_digit())
        || NUMBER_WORDS.contains(&word.to_lowercase().as_str())
}

/// Whether every word of `t` is a number written in digits ("1.", "2, 3",
/// "0 7 9 1").
fn digits_only(t: &str) -> bool {
    t.split_whitespace().all(|w| {
        let w = w.trim_matches(|c: char| !c.is_alphanumeric());
        !w.is_empty() && w.chars().all(|c| c.is_ascii_digit())
    })
}

/// Whether whisper, hearing a turn and what followed it as one clip
/// (`whole`), wrote them as one sentence: no final `.`, `?` or `!` where
/// `before` (its transcript of the turn alone, which read as a finished
/// sentence) ended. Heard alone, the start of a sentence before a pause
/// is often written as a sentence ("Today only platform.", "And so, my
/// fellow citizens."); heard whole, whisper hears the sentence run on
/// ("Today only platforms 1 and 3 are used."), and keeps the stop between
/// two sentences ("7 of clubs. Go forward 10 meters.").
///
/// The place is the last word of `before` found again in `whole` near
/// the same count of words (whisper may drop or add a word when it hears
/// more: "The code for the door is 7, 7, 3, 1." heard whole as "The code
/// for the door 7, 7, 3, 1. My number …"); where that word changed
/// ("platform." against "platforms"), no sentence may end within a word
/// of the count. A `whole` no longer than `before` (whisper stopped at
/// the pause) is not one sentence. Nor is a `whole` with no final mark
/// anywhere that has the turn's last word unchanged ("7 of clubs go
/// forward"): whisper, hearing a short clip, may leave out all its
/// punctuation, which then shows nothing; that word heard otherwise
/// ("Today only platforms 1 and 3") is whisper hearing it run on.
#[must_use]
pub fn heard_as_one(before: &str, whole: &str) -> bool {
    match mark_at_the_pause(before, whole) {
        Some((AtPause::RunsOn, found)) => !found || whole.contains(['.', '?', '!']),
        _ => false,
    }
}

/// Whether whisper, hearing a turn and what followed it as one clip
/// (`whole`), ends a sentence where `before` ended: the same place as
/// [`heard_as_one`] finds. For a turn whose words have no final mark
/// ([`WordsVerdict::Unmarked`]), which goes on unless shown otherwise: a
/// `whole` no longer than `before` (whisper stopped at the pause and
/// dropped what followed) shows nothing, and it is not apart; nor is an
/// ellipsis there ("… how much... There might be …"), whisper's mark of
/// a pause rather than of an end.
#[must_use]
pub fn heard_apart(before: &str, whole: &str) -> bool {
    matches!(mark_at_the_pause(before, whole), Some((AtPause::Ends, _)))
}

/// What `whole` writes where `before` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AtPause {
    /// No final mark: the sentence runs on.
    RunsOn,
    /// A final `.`, `?` or `!`.
    Ends,
    /// An ellipsis: whisper heard a pause, not whether it ended.
    Trails,
}

/// What `whole` writes at the place `before` ended (see [`heard_as_one`]),
/// and whether `before`'s last word is there unchanged; `None` when
/// `whole` is no longer than `before`.
fn mark_at_the_pause(before: &str, whole: &str) -> Option<(AtPause, bool)> {
    let plain = |w: &str| {
        w.trim_matches(|c: char| !c.is_alphanumeric())
            .to_lowercase()
    };
    let mark = |w: &str| {
        let w = w.trim_end_matches(['"', '\'', ')', ']', '»', '”', '’']);
        if w.ends_with("..") || w.ends_with('…') {
            AtPause::Trails
        } else if w.ends_with(['.', '?', '!']) {
            AtPause::Ends
        } else {
            AtPause::RunsOn
        }
    };
    let last = before.split_whitespace().last().map(plain)?;
    let n = before.split_whitespace().count();
    let words: Vec<&str> = whole.split_whitespace().collect();
    if words.len() <= n {
        return None;
    }
    let found = (n.saturating_sub(3)..=n + 1)
        .filter(|&i| words.get(i).is_some_and(|w| plain(w) == last))
        .min_by_key(|&i| i.abs_diff(n - 1));
    Some(match found {
        Some(i) => (mark(words[i]), true),
        None => (
            (n.saturating_sub(2)..=n)
                .map(|i| mark(words[i]))
                .max_by_key(|m| match m {
                    AtPause::Ends => 2,
                    AtPause::Trails => 1,
                    AtPause::RunsOn => 0,
                })
                .unwrap_or(AtPause::RunsOn),
            false,
        ),
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_question_mark_asks() {
        assert!(super::asks("What time is it now? "));
        assert!(!super::asks("He was not."));
        assert!(!super::asks("What time is it"));
        assert!(!super::asks(""));
    }

    use super::{goes_on, heard_apart, heard_as_one, sentence_end, WordsVerdict};

    #[test]
    fn heard_whole_a_sentence_that_runs_on_is_one() {
        // whisper's transcripts of the turn alone, then with what followed
        let one = [
            (
                "Today only platform.",
                "Today only platforms 1 and 3 are used.",
            ),
            // no mark anywhere, but the word at the pause heard otherwise
            ("Today only platform.", "Today only platforms 1 and 3"),
            (
                "And so, my fellow citizens.",
                "And so, my fellow citizens ask not what your country can do for you.",
            ),
            (
                "Set a timer for 20 minutes.",
                "Set a timer for 20 minutes and then remind me to call my sister.",
            ),
        ];
        for (before, whole) in one {
            assert!(heard_as_one(before, whole), "{before:?} / {whole:?}");
        }
        let two = [
            // two sentences keep their stop
            ("7 of clubs.", "7 of clubs. Go forward 10 meters."),
            (
                "Experience proves this.",
                "Experience proves this. And Mr. John Dashwood had then leisure.",
            ),
            ("Why?", "Why? \"Because.\""),
            // no mark anywhere: whisper wrote none, which shows nothing
            ("7 of clubs.", "7 of clubs go forward"),
            // a word dropped, heard whole: the stop is found where it moved
            (
                "The code for the door is 7, 7, 3, 1.",
                "The code for the door 7, 7, 3, 1. My number is 415-238-9901.",
            ),
            // a word changed: no stop within a word of the place
            (
                "He was not an illness.",
                "He was not an Ilds. Fosed young man?",
            ),
            // whisper stopped at the pause, or heard nothing
            ("Experience proves this.", "Experience proves this."),
            ("", "Go forward 10 meters."),
            ("Go forward.", ""),
        ];
        for (before, whole) in two {
            assert!(!heard_as_one(before, whole), "{before:?} / {whole:?}");
        }
    }

    #[test]
    fn what_follows_goes_on_in_lower_case_or_in_the_same_number() {
        // whisper's transcripts of what followed a pause inside a sentence
        for (before, after) in [
            (
                "Mr. Quilter is the apostle of the middle classes.",
                "and we are glad to welcome his gospel.",
            ),
            ("I need eggs, milk.", "bread and a bag of rice."),
            (
                "It was my reports from the north which chiefly induced people.",
                "full to bye.",
            ),
            ("My number is 415.", "238-9901."),
            ("My number is 415-238.", "9 9 0 1"),
            ("The code for the door is 7.", "7 3 1"),
            ("So I thought.", "...maybe not."),
            ("The code for the door is 7, 7.", "Three, one."),
            ("I need eggs.", "Milk."),
            ("Go forward.", "10 meters."),
            ("The meeting is on Tuesday.", "At three."),
            ("7", "Three, one."),
            ("My number is four one five.", "2 3 8"),
        ] {
            assert!(goes_on(before, after), "{before:?} {after:?}");
        }
        // and of a new sentence after a finished one
        for (before, after) in [
            (
                "What is the capital of France?",
                "How tall is the Eiffel Tower?",
            ),
            (
                "1, 2, 3.",
                "It was my reports from the North which chiefly induced people to buy.",
            ),
            ("Set a timer for 20 minutes.", "The code for the door is 7."),
            ("It is at 3.", "One more thing."),
            ("Set a timer for 20 minutes.", "Thank you."),
            ("Tell me a story.", "Stop."),
            ("Tell me a story.", "Why?"),
            ("What is the capital of France?", "Germany?"),
            ("He was not.", "An ill-disposed young man?"),
            ("He was not an ill-disposed young man.", "7."),
            ("He was not an old-sposed young man.", "7F Clopes"),
            ("I need eggs.", "[coughing]"),
            ("I need eggs.", ""),
        ] {
            assert!(!goes_on(before, after), "{before:?} {after:?}");
        }
    }

    /// Every one of `texts` reads as `verdict`.
    fn all_read_as(verdict: WordsVerdict, texts: &[&str]) {
        for t in texts {
            assert_eq!(sentence_end(t), verdict, "{t:?}");
        }
    }

    #[test]
    fn finished_sentences_and_questions_are_complete() {
        all_read_as(
            WordsVerdict::Complete,
            &[
                "What is the capital of France?",
                " What is the moon made of? ",
                "Tell me a short story about a cat.",
                "Okay.",
                "Where are you from?",
                "What is it for?",
                "I need eggs, milk, bread, and a bag of rice.",
                "Stop!",
                "He said \"yes.\"",
                "My number is 415-238-9901.",
                "Thank you.",
                "Ask not what your country can do for you.",
            ],
        );
    }

    #[test]
    fn words_that_stop_midway_are_fragments() {
        all_read_as(
            WordsVerdict::Fragment,
            &[
                "And so my fellow Americans,",
                "I need eggs, milk, bread, and.",
                "The code for the door is...",
                "Set a timer for twenty minutes and then…",
                "What is the capital of the?",
                "I was thinking about.",
                "My number is four one five -",
                "Can you tell me um",
                "The meeting is on Tuesday at.",
                "I went to the.",
                "And then I.",
                "So what they.",
            ],
        );
    }

    #[test]
    fn digits_alone_are_a_number() {
        all_read_as(
            WordsVerdict::Number,
            &["1.", "2, 3.", "0 7 9 1.", "415 238.", "1, 2, 3."],
        );
        // what follows says whether the number went on
        assert!(goes_on("1.", "2, 3"));
        assert!(!goes_on(
            "1, 2, 3.",
            "It was my reports from the North which chiefly induced people to buy."
        ));
    }

    #[test]
    fn sounds_and_empty_text_cannot_tell() {
        all_read_as(
            WordsVerdict::Unknown,
            &[
                "",
                "   ",
                "(dramatic music)",
                "[BLANK_AUDIO]",
                "[noise: How far?]",
                "?!",
            ],
        );
        for v in [WordsVerdict::Unknown, WordsVerdict::Fragment] {
            assert!(!v.may_end() && !v.may_hold(), "{v:?}");
        }
    }

    #[test]
    fn words_without_a_final_mark_hold_but_do_not_end() {
        all_read_as(
            WordsVerdict::Unmarked,
            &[
                "what is the capital of France",
                "7F Clubs",
                "Go forward 10 meters",
                "He was not",
            ],
        );
        assert!(!WordsVerdict::Unmarked.may_end());
        assert!(WordsVerdict::Unmarked.may_hold());
        // speech that follows then decides: two sentences heard whole keep
        // their stop, a sentence run on is one
        assert!(heard_apart("7F Clubs", "7 of clubs. Go forward 10 meters."));
        assert!(!heard_apart(
            "He was not",
            "He was not an ill-disposed young man."
        ));
        // whisper stopping at the pause, heard whole, shows nothing: a turn
        // with no final mark is not apart, a finished one not one
        let (before, whole) = (
            "And Mr. John Dashwood had then leisure to consider how much",
            "And Mr. John Dashwood had then leisure to consider how much.",
        );
        assert!(!heard_apart(before, whole) && !heard_as_one(before, whole));
        // an ellipsis where it ended is a pause heard, not an end: not
        // apart (so one turn), nor one where the turn's words had a stop
        let whole = "And Mr. John Dashwood had then leisure to consider how much... There might be prudently in his power to do for them.";
        assert!(!heard_apart(before, whole));
        assert!(!heard_as_one(&format!("{before}."), whole));
        assert!(!heard_apart(
            "7F Clubs",
            "7 of clubs… Go forward 10 meters."
        ));
    }

    #[test]
    fn over_its_voice_only_a_joined_clause_or_more_of_the_number_goes_on() {
        use super::goes_on_over_its_voice as over;
        let classes = "Mr. Quilter is the apostle of the middle classes.";
        assert!(over(classes, "and we are glad to welcome his gospel."));
        assert!(over("My number is 415.", "238-9901."));
        assert!(over("7, 7.", "Three, one."));
        // whisper's lower case alone is not enough there
        assert!(!over("7 of clubs.", "go forward 10 meters."));
        assert!(!over(classes, "And we are glad to welcome his gospel."));
        assert!(!over("Go forward.", "10 meters."));
        assert!(!over(classes, "[inaudible]"));
        assert!(goes_on("7 of clubs.", "go forward 10 meters."));
    }
}
