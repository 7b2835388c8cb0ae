//! Prompt lookup: drafts the next tokens by finding the context's last n tokens earlier in the
//! context and copying what followed them there. Text that quotes or repeats itself (code being
//! edited, a document being summarised, a list that recurs) drafts well; other text finds no
//! match, and its steps stay plain decode steps.

/// Appends to `out` `max` tokens that followed the latest earlier occurrence of the
/// last n tokens of `context`, trying n = `LOOKUP_MAX` first and down to `LOOKUP_MIN`. Appends
/// nothing where no such n-gram recurs.
///
/// The latest occurrence is preferred: it reflects the text nearest to what comes next. The
/// copy goes on past the context's end by reading what it has drafted (as an LZ77 copy does):
/// an occurrence d tokens before the suffix (a run of one repeated token, a recurring line)
/// drafts that period of d tokens again, up to `max`.
pub fn draft<const LOOKUP_MAX: usize, const LOOKUP_MIN: usize>(
    context: &[u32],
    max: usize,
    out: &mut Vec<u32>,
) {
    const {
        assert!(
            LOOKUP_MIN >= 1 && LOOKUP_MIN <= LOOKUP_MAX,
            "need 1 <= LOOKUP_MIN <= LOOKUP_MAX"
        )
    };
    if max == 0 {
        return;
    }
    let len = context.len();
    for n in (LOOKUP_MIN..=LOOKUP_MAX).rev() {
        if n >= len {
            continue;
        }
        let suffix = &context[len - n..];
        // Candidate starts, latest first; a match must be followed by at least one token.
        for start in (0..len - n).rev() {
            if &context[start..start + n] == suffix {
                // Copy from `from` on, reading the draft itself past the context's end: a match
                // d tokens back repeats a period of d, as far as `max` goes.
                let (from, base) = (start + n, out.len());
                for i in from..from + max {
                    let token = if i < len { context[i] } else { out[base + i - len] };
                    out.push(token);
                }
                return;
            }
        }
    }
}
