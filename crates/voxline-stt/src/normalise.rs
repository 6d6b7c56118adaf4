//! Text normalisation for word error rate.
//!
//! Whisper writes "10", "Mr." and "25%" where a reference transcript spells
//! "ten", "mister" and "twenty five percent"; scored word by word, each such
//! difference would count as an error although nothing was misheard. Both
//! sides are therefore brought to one canonical form before comparing, in the
//! spirit of the English normaliser whisper's authors score with:
//!
//! - lower case; curly apostrophes made straight; text in brackets or
//!   parentheses (`[BLANK_AUDIO]`, `(laughs)`) removed;
//! - punctuation and hyphens become spaces, except a decimal point between
//!   digits and apostrophes inside words; `1,000` loses its grouping comma;
//! - symbols become words: `%` → `percent`, `$5` → `5 dollars` (also `£`
//!   pounds, `€` euros);
//! - spoken numbers become digits: `ten` → `10`, `twenty five` → `25`,
//!   `one hundred and five` → `105`, `two thousand twenty` → `2020`,
//!   `three point five` → `3.5`, `nineteen eighty four` → `1984` (a teen
//!   followed by a two-digit number is read as a year); separate digits stay
//!   separate (`one two three` → `1 2 3`); ordinals keep their suffix
//!   (`twenty first` → `21st`, `first` → `1st`), except a lone `second`, which
//!   is as often a unit of time: it stays a word and `2nd` becomes `second`;
//! - titles and common abbreviations are spelled out (`mr` → `mister`,
//!   `dr` → `doctor`, `st` → `saint`, …), negative and other contractions
//!   expanded (`won't` → `will not`, `they're` → `they are`), a few British
//!   spellings made American (`metres` → `meters`), `ok` → `okay`, and
//!   hesitations (`um`, `uh`, `hmm`) dropped.

/// Normalises text for word error rate (see the module documentation): the
/// canonical words, in order.
#[must_use]
pub fn normalise(text: &str) -> Vec<String> {
    let cleaned = clean(&text.to_lowercase());
    let mut words: Vec<String> = Vec::new();
    for raw in cleaned.split_whitespace() {
        let w = raw.trim_matches('\'');
        if w.is_empty() || FILLERS.contains(&w) {
            continue;
        }
        expand(w, &mut words);
    }
    numbers(&words)
}

/// Hesitations whisper and human transcribers write or leave out at will.
const FILLERS: &[&str] = &["uh", "um", "umm", "hmm", "mm", "mmm", "mhm"];

/// Titles and abbreviations, written without their period.
const ABBREVIATIONS: &[(&str, &str)] = &[
    ("mr", "mister"),
    ("mrs", "missus"),
    ("ms", "miss"),
    ("dr", "doctor"),
    ("st", "saint"),
    ("jr", "junior"),
    ("sr", "senior"),
    ("prof", "professor"),
    ("capt", "captain"),
    ("gen", "general"),
    ("lt", "lieutenant"),
    ("col", "colonel"),
    ("sgt", "sergeant"),
    ("gov", "governor"),
    ("rev", "reverend"),
    ("hon", "honorable"),
    ("sen", "senator"),
    ("rep", "representative"),
    ("pres", "president"),
    ("vs", "versus"),
    ("ok", "okay"),
];

/// British spellings whisper and references mix, mapped to the American ones.
const SPELLINGS: &[(&str, &str)] = &[
    ("metre", "meter"),
    ("metres", "meters"),
    ("kilometre", "kilometer"),
    ("kilometres", "kilometers"),
    ("centimetre", "centimeter"),
    ("centimetres", "centimeters"),
    ("litre", "liter"),
    ("litres", "liters"),
    ("centre", "center"),
    ("theatre", "theater"),
    ("colour", "color"),
    ("colours", "colors"),
    ("favourite", "favorite"),
    ("honour", "honor"),
    ("neighbour", "neighbor"),
    ("neighbours", "neighbors"),
    ("grey", "gray"),
    ("realise", "realize"),
    ("realised", "realized"),
    ("organise", "organize"),
    ("organised", "organized"),
    ("travelled", "traveled"),
    ("travelling", "traveling"),
];

/// Lower-cased text → words separated by spaces: brackets dropped, symbols
/// spelled, punctuation removed (see the module documentation).
fn clean(text: &str) -> String {
    let chars: Vec<char> = text
        .chars()
        .map(|c| match c {
            '\u{2018}' | '\u{2019}' | '\u{02bc}' => '\'',
            c => c,
        })
        .collect();
    let digit_at = |i: usize| chars.get(i).is_some_and(char::is_ascii_digit);
    let mut out = String::with_capacity(chars.len() + 8);
    let mut depth = 0usize;
    // a currency word owed after the number that follows its symbol
    let mut currency: Option<&str> = None;
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '[' | '(' | '{' | '<' => depth += 1,
            ']' | ')' | '}' | '>' => depth = depth.saturating_sub(1),
            _ if depth > 0 => {}
            '$' | '£' | '€' if digit_at(i + 1) => {
                out.push(' ');
                currency = Some(match c {
                    '$' => "dollars",
                    '£' => "pounds",
                    _ => "euros",
                });
            }
            '%' => out.push_str(" percent "),
            // 1,000 → 1000: a comma between a digit and exactly three digits
            ',' if i > 0
                && digit_at(i - 1)
                && (1..=3).all(|k| digit_at(i + k))
                && !digit_at(i + 4) => {}
            '.' if i > 0 && digit_at(i - 1) && digit_at(i + 1) => out.push('.'),
            c if c.is_alphanumeric() || c == '\'' => out.push(c),
            _ => out.push(' '),
        }
        if let Some(word) = currency {
            // the number ends where the next character is no longer part of it
            let in_number =
                digit_at(i + 1) || (matches!(chars.get(i + 1), Some('.' | ',')) && digit_at(i + 2));
            if c.is_ascii_digit() && !in_number {
                out.push(' ');
                out.push_str(word);
                out.push(' ');
                currency = None;
            }
        }
        i += 1;
    }
    out
}

/// Spells out an abbreviation or contraction, maps a spelling variant, and
/// pushes the resulting word(s).
fn expand(w: &str, out: &mut Vec<String>) {
    let push = |out: &mut Vec<String>, s: &str| out.extend(s.split(' ').map(str::to_string));
    if let Some((_, full)) = ABBREVIATIONS
        .iter()
        .chain(SPELLINGS)
        .find(|(short, _)| *short == w)
    {
        return push(out, full);
    }
    match w {
        "won't" => return push(out, "will not"),
        "can't" | "cannot" => return push(out, "can not"),
        "shan't" => return push(out, "shall not"),
        "ain't" => return push(out, "ain't"),
        "let's" => return push(out, "let us"),
        _ => {}
    }
    for (suffix, word) in [
        ("n't", "not"),
        ("'re", "are"),
        ("'ll", "will"),
        ("'ve", "have"),
        ("'m", "am"),
        ("'d", "would"),
    ] {
        if let Some(stem) = w.strip_suffix(suffix) {
            if !stem.is_empty() {
                out.push(stem.to_string());
                out.push(word.to_string());
                return;
            }
        }
    }
    out.push(w.to_string());
}

/// What a number word is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// 1–9
    Unit,
    /// 10–19
    Teen,
    /// 20, 30, … 90
    Tens,
    /// hundred
    Hundred,
    /// thousand, million, …
    Scale,
}

/// A number word: its kind, value and whether it is an ordinal.
fn number_word(w: &str) -> Option<(Kind, u64, bool)> {
    const UNITS: [&str; 9] = [
        "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
    ];
    const UNIT_ORD: [&str; 9] = [
        "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth",
    ];
    const TEENS: [&str; 10] = [
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
    ];
    const TEEN_ORD: [&str; 10] = [
        "tenth",
        "eleventh",
        "twelfth",
        "thirteenth",
        "fourteenth",
        "fifteenth",
        "sixteenth",
        "seventeenth",
        "eighteenth",
        "nineteenth",
    ];
    const TENS: [&str; 8] = [
        "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
    ];
    const TENS_ORD: [&str; 8] = [
        "twentieth",
        "thirtieth",
        "fortieth",
        "fiftieth",
        "sixtieth",
        "seventieth",
        "eightieth",
        "ninetieth",
    ];
    const SCALES: [(&str, &str, u64); 4] = [
        ("thousand", "thousandth", 1_000),
        ("million", "millionth", 1_000_000),
        ("billion", "billionth", 1_000_000_000),
        ("trillion", "trillionth", 1_000_000_000_000),
    ];
    let find = |list: &[&str]| list.iter().position(|x| *x == w).map(|i| i as u64);
    if let Some(i) = find(&UNITS) {
        return Some((Kind::Unit, i + 1, false));
    }
    if let Some(i) = find(&UNIT_ORD) {
        return Some((Kind::Unit, i + 1, true));
    }
    if let Some(i) = find(&TEENS) {
        return Some((Kind::Teen, i + 10, false));
    }
    if let Some(i) = find(&TEEN_ORD) {
        return Some((Kind::Teen, i + 10, true));
    }
    if let Some(i) = find(&TENS) {
        return Some((Kind::Tens, (i + 2) * 10, false));
    }
    if let Some(i) = find(&TENS_ORD) {
        return Some((Kind::Tens, (i + 2) * 10, true));
    }
    match w {
        "hundred" => return Some((Kind::Hundred, 100, false)),
        "hundredth" => return Some((Kind::Hundred, 100, true)),
        _ => {}
    }
    SCALES
        .iter()
        .find_map(|&(card, ord, v)| (w == card || w == ord).then_some((Kind::Scale, v, w == ord)))
}

/// A digit for `point …`: `zero`, `oh` or a unit word.
fn decimal_digit(w: &str) -> Option<u64> {
    match w {
        "zero" | "oh" => Some(0),
        _ => match number_word(w) {
            Some((Kind::Unit, v, false)) => Some(v),
            _ => None,
        },
    }
}

/// The English ordinal suffix of `n`.
fn ordinal_suffix(n: u64) -> &'static str {
    match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    }
}

/// The spoken number starting at `words[start]`, if there is one: its
/// canonical text and how many words it took.
fn parse_number(words: &[String], start: usize) -> Option<(String, usize)> {
    let word = |i: usize| words.get(i).map(String::as_str);
    let (value, mut i, ordinal) = if word(start) == Some("zero") {
        (0, start + 1, false)
    } else {
        spoken_integer(words, start)?
    };
    if ordinal {
        return Some((format!("{value}{}", ordinal_suffix(value)), i - start));
    }
    // "three point five"
    if word(i) == Some("point") && word(i + 1).and_then(decimal_digit).is_some() {
        let mut text = format!("{value}.");
        i += 1;
        while let Some(d) = word(i).and_then(decimal_digit) {
            text.push(char::from_digit(u32::try_from(d).unwrap_or(0), 10).unwrap_or('0'));
            i += 1;
        }
        return Some((text, i - start));
    }
    Some((value.to_string(), i - start))
}

/// The whole number spoken from `words[start]`: its value, the index after
/// it, and whether it ended with an ordinal word; `None` when `words[start]`
/// does not start one.
fn spoken_integer(words: &[String], start: usize) -> Option<(u64, usize, bool)> {
    let word = |i: usize| words.get(i).map(String::as_str);
    // total: finished scale groups; group: the part after the last scale
    let (mut total, mut group) = (0u64, 0u64);
    // the kind of the last word below a hundred in `group`, if any since the
    // last hundred or scale
    let mut sub: Option<Kind> = None;
    let (mut hundred_done, mut year) = (false, false);
    let mut last_scale: Option<u64> = None;
    let mut ordinal = false;
    let mut i = start;
    while let Some(w) = word(i) {
        let year_start = sub == Some(Kind::Teen)
            && group >= 11
            && !hundred_done
            && last_scale.is_none()
            && !year;
        let Some((kind, v, ord)) = number_word(w) else {
            // "one hundred and five": `and` joins only after a hundred or a scale
            let joins = w == "and"
                && i > start
                && sub.is_none()
                && (hundred_done || last_scale.is_some())
                && word(i + 1)
                    .and_then(number_word)
                    .is_some_and(|(k, _, _)| matches!(k, Kind::Unit | Kind::Teen | Kind::Tens));
            // "nineteen oh five"
            let oh = w == "oh"
                && year_start
                && word(i + 1)
                    .and_then(number_word)
                    .is_some_and(|(k, _, o)| k == Kind::Unit && !o);
            if joins {
                i += 1;
                continue;
            }
            if oh {
                group *= 100;
                year = true;
                sub = Some(Kind::Tens);
                i += 1;
                continue;
            }
            break;
        };
        let fits = match kind {
            Kind::Unit => matches!(sub, None | Some(Kind::Tens)),
            // after a teen, a two-digit number makes a year: "nineteen eighty"
            Kind::Teen | Kind::Tens => sub.is_none() || year_start,
            Kind::Hundred => {
                !hundred_done
                    && !year
                    && if i == start {
                        true
                    } else {
                        sub.is_some() && (1..=99).contains(&(group % 100))
                    }
            }
            Kind::Scale => !year && (group > 0 || i == start) && last_scale.is_none_or(|s| v < s),
        };
        // a lone `second` is as often time as an ordinal: only "twenty second" is one
        if !fits || (ord && v == 2 && sub != Some(Kind::Tens)) {
            break;
        }
        match kind {
            Kind::Unit | Kind::Teen | Kind::Tens => {
                if sub.is_some() && kind != Kind::Unit {
                    group *= 100;
                    year = true;
                }
                group += v;
                sub = Some(kind);
            }
            Kind::Hundred => {
                group = group.max(1) * 100;
                hundred_done = true;
                sub = None;
            }
            Kind::Scale => {
                total = total.saturating_add(group.max(1).saturating_mul(v));
                group = 0;
                hundred_done = false;
                sub = None;
                last_scale = Some(v);
            }
        }
        i += 1;
        if ord {
            ordinal = true;
            break;
        }
    }
    (i > start).then_some((total.saturating_add(group), i, ordinal))
}

/// Replaces every spoken number in `words` with its digits, and written
/// ordinals `2nd` with `second` (see the module documentation).
fn numbers(words: &[String]) -> Vec<String> {
    let mut out = Vec::with_capacity(words.len());
    let mut i = 0;
    while i < words.len() {
        if let Some((text, n)) = parse_number(words, i) {
            out.push(text);
            i += n;
            continue;
        }
        let w = &words[i];
        out.push(if w == "2nd" {
            "second".to_string()
        } else {
            w.clone()
        });
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::normalise;

    fn n(s: &str) -> String {
        normalise(s).join(" ")
    }

    #[test]
    fn case_punctuation_and_brackets() {
        assert_eq!(
            n("What is the capital of France?"),
            "what is the capital of france"
        );
        assert_eq!(n("  Hello,   world!  "), "hello world");
        assert_eq!(n("[BLANK_AUDIO]"), "");
        assert_eq!(n("(laughs) Well [music] then"), "well then");
        assert_eq!(n("Two-plus two’s"), "2 plus two's");
        assert_eq!(n("'quoted' words"), "quoted words");
        assert_eq!(n("Um, I uh think so. Hmm."), "i think so");
    }

    #[test]
    fn cardinal_numbers_become_digits() {
        assert_eq!(n("go forward ten meters"), n("Go forward 10 meters."));
        assert_eq!(n("go forward ten meters"), "go forward 10 meters");
        assert_eq!(n("twenty five"), "25");
        assert_eq!(n("twenty-five"), "25");
        assert_eq!(n("one hundred"), "100");
        assert_eq!(n("hundred"), "100");
        assert_eq!(n("one hundred and five"), "105");
        assert_eq!(n("three hundred forty two"), "342");
        assert_eq!(n("twenty five hundred"), "2500");
        assert_eq!(n("two thousand twenty"), "2020");
        assert_eq!(n("two thousand and six"), "2006");
        assert_eq!(n("one million two hundred thousand"), "1200000");
        assert_eq!(n("thousand"), "1000");
        assert_eq!(n("zero"), "0");
        assert_eq!(n("seven of clubs"), "7 of clubs");
        assert_eq!(n("platforms one and three"), "platforms 1 and 3");
    }

    #[test]
    fn separate_numbers_stay_separate() {
        assert_eq!(n("one two three"), "1 2 3");
        assert_eq!(n("1, 2, 3."), "1 2 3");
        assert_eq!(n("twenty thirty"), "20 30");
        assert_eq!(n("five six"), "5 6");
        assert_eq!(n("ten eleven"), "10 11");
        assert_eq!(n("a hundred and one dalmatians"), "a 101 dalmatians");
        assert_eq!(n("one hundred and"), "100 and");
        assert_eq!(n("thousand million"), "1000 1000000");
        assert_eq!(n("one thousand one thousand"), "1001 1000");
    }

    #[test]
    fn years_decimals_and_ordinals() {
        assert_eq!(n("nineteen eighty four"), "1984");
        assert_eq!(n("in 1984"), n("in nineteen eighty-four"));
        assert_eq!(n("nineteen oh five"), "1905");
        assert_eq!(n("eighteen twelve"), "1812");
        assert_eq!(n("three point five"), "3.5");
        assert_eq!(n("3.5"), "3.5");
        assert_eq!(n("zero point zero five"), "0.05");
        assert_eq!(n("one point oh five"), "1.05");
        assert_eq!(n("the end. Then"), "the end then");
        assert_eq!(n("twenty first"), "21st");
        assert_eq!(n("the first time"), "the 1st time");
        assert_eq!(n("the 1st time"), "the 1st time");
        assert_eq!(n("third"), "3rd");
        assert_eq!(n("twelfth"), "12th");
        assert_eq!(n("one hundredth"), "100th");
        assert_eq!(n("twenty second"), "22nd");
        assert_eq!(n("wait a second"), "wait a second");
        assert_eq!(n("the 2nd time"), "the second time");
        assert_eq!(n("one second"), "1 second");
    }

    #[test]
    fn symbols_and_grouping() {
        assert_eq!(n("10%"), "10 percent");
        assert_eq!(n("ten percent"), "10 percent");
        assert_eq!(n("$5"), "5 dollars");
        assert_eq!(n("five dollars"), "5 dollars");
        assert_eq!(n("$1,250.50 each"), "1250.50 dollars each");
        assert_eq!(n("£20"), "20 pounds");
        assert_eq!(n("1,000"), "1000");
        assert_eq!(n("one thousand"), "1000");
        assert_eq!(n("1,2"), "1 2");
        assert_eq!(n("10:30"), n("ten thirty"));
    }

    #[test]
    fn abbreviations_contractions_and_spellings() {
        assert_eq!(n("Mr. Quilter"), "mister quilter");
        assert_eq!(n("mister quilter"), "mister quilter");
        assert_eq!(
            n("Mrs. Smith and Dr. Jones"),
            "missus smith and doctor jones"
        );
        assert_eq!(n("St. Paul"), "saint paul");
        assert_eq!(n("Martin Luther King Jr."), "martin luther king junior");
        assert_eq!(n("OK"), "okay");
        assert_eq!(
            n("I won't, you can't, they don't"),
            "i will not you can not they do not"
        );
        assert_eq!(
            n("we're here and I'm sure you'll see"),
            "we are here and i am sure you will see"
        );
        assert_eq!(n("cannot"), "can not");
        assert_eq!(n("ten metres"), n("10 meters"));
        assert_eq!(n("the colour grey"), "the color gray");
    }

    #[test]
    fn the_human_references_match_what_whisper_writes() {
        // what the shared recordings' references say vs whisper's spelling
        for (reference, whisper) in [
            (
                "Mr. Quilter is the apostle of the middle classes and we are glad to welcome his gospel.",
                " Mister Quilter is the apostle of the middle classes, and we are glad to welcome his gospel.",
            ),
            ("and mister john dashwood had then leisure", "And Mr. John Dashwood had then leisure"),
            ("go forward ten meters", "Go forward 10 meters."),
            ("Today only platforms one and three are used.", "Today, only platforms 1 and 3 are used."),
            ("one two three", "1, 2, 3."),
            ("seven of clubs", "7 of clubs."),
        ] {
            assert_eq!(normalise(reference), normalise(whisper), "{reference} / {whisper}");
        }
    }
}
