//! The wording shared by the errors: the known name a word is likely a
//! misspelling of, and lists of names.

/// The candidate that `unknown` is most likely a misspelling of: one letter
/// added, dropped or changed, or two letters swapped.
pub(crate) fn similar<'a>(unknown: &str, candidates: &[&'a str]) -> Option<&'a str> {
    candidates
        .iter()
        .map(|known| (distance(unknown, known), *known))
        .filter(|(d, known)| *d <= 1 || (*d == 2 && same_letters(unknown, known)))
        .min_by_key(|(d, _)| *d)
        .map(|(_, known)| known)
}

/// `stroe` and `store`: two letters swapped.
fn same_letters(a: &str, b: &str) -> bool {
    let mut a: Vec<char> = a.chars().collect();
    let mut b: Vec<char> = b.chars().collect();
    a.sort_unstable();
    b.sort_unstable();
    a == b
}

/// Levenshtein distance between two short ASCII-ish words.
pub(crate) fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = if ca == *cb {
                prev
            } else {
                1 + prev.min(cur).min(row[j])
            };
            prev = cur;
        }
    }
    row[b.len()]
}

/// `a`, `a and b`, `a, b and c` (with `word` in place of `and`).
pub(crate) fn list(items: &[String], word: &str) -> String {
    match items {
        [] => String::new(),
        [only] => only.clone(),
        [first @ .., last] => format!("{} {word} {last}", first.join(", ")),
    }
}
