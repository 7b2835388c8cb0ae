//! Reference BERT embedding: the sum of a word, a token-type and a position row, added in
//! that order (as Hugging Face's BertEmbeddings adds them).

/// Writes `words[ids[p]] + positions[p] + types[token_types[p]]` into row `p` of `out`.
///
/// `ids`, `token_types`: `[len]`; `out`: `[len, DIM]`; the tables are `[rows, DIM]`.
#[inline]
pub fn embed<const DIM: usize>(
    out: &mut [f32],
    ids: &[u32],
    token_types: &[u32],
    words: &[f32],
    positions: &[f32],
    types: &[f32],
) {
    let len = ids.len();
    assert!(
        token_types.len() == len,
        "embed: {len} ids but {} token types",
        token_types.len()
    );
    assert!(out.len() >= len * DIM, "embed: out is shorter than {len} rows of {DIM}");
    assert!(
        positions.len() >= len * DIM,
        "embed: the position table has fewer than {len} rows"
    );
    for (p, (&id, &kind)) in ids.iter().zip(token_types).enumerate() {
        let word = &words[id as usize * DIM..][..DIM];
        let position = &positions[p * DIM..][..DIM];
        let kind = &types[kind as usize * DIM..][..DIM];
        let row = &mut out[p * DIM..][..DIM];
        for i in 0..DIM {
            row[i] = word[i] + kind[i] + position[i];
        }
    }
}
