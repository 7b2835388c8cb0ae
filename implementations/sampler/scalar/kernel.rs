//! Reference sampler: greedy at temperature 0; otherwise temperature, top-k and top-p
//! (nucleus) sampling in the order of Hugging Face's logits warpers.
//!
//! Sampling takes the softmax of `logits / temperature` in f32 (maximum subtracted), sorts
//! the tokens by descending probability (ascending id among equals), keeps the `top_k` most
//! likely and renormalises them (as the softmax after Hugging Face's top-k masking does),
//! keeps the shortest prefix of those whose probabilities reach `top_p`, renormalises
//! again, and returns the token at which the cumulative probability first exceeds `coin`.

/// Picks the next token from `logits` (`[VOCAB]`) with a uniform `coin` in [0, 1).
///
/// At `temperature` 0 it returns the first index of the largest logit, as `torch.argmax`
/// does. `top_k` 0 keeps every token; `top_p` 1.0 keeps every token that top-k kept.
/// `scratch` is reused between calls to avoid allocating.
#[inline]
pub fn sample<const VOCAB: usize>(
    logits: &[f32],
    temperature: f32,
    top_k: usize,
    top_p: f32,
    coin: f32,
    scratch: &mut Vec<(f32, u32)>,
) -> u32 {
    const {
        assert!(
            VOCAB > 0 && VOCAB <= u32::MAX as usize,
            "VOCAB must be a positive u32"
        )
    };
    let logits = &logits[..VOCAB];
    if temperature <= 0.0 {
        return argmax(logits);
    }

    // Softmax of logits / temperature, with the maximum subtracted before dividing, so that
    // a tiny temperature cannot overflow (it tends to greedy, as it should).
    let max = logits.iter().fold(f32::NEG_INFINITY, |max, &l| max.max(l));
    scratch.clear();
    scratch.extend(
        logits
            .iter()
            .zip(0u32..)
            .map(|(&logit, id)| (((logit - max) / temperature).exp(), id)),
    );
    renormalise(scratch);

    // Most likely first; among equal probabilities, the lower id first.
    scratch.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    if top_k > 0 {
        scratch.truncate(top_k);
        renormalise(scratch);
    }

    // The shortest prefix whose probabilities sum to at least top_p.
    let mut cumulative = 0.0f32;
    let mut keep = scratch.len();
    for (i, &(p, _)) in scratch.iter().enumerate() {
        cumulative += p;
        if cumulative >= top_p {
            keep = i + 1;
            break;
        }
    }
    scratch.truncate(keep);
    renormalise(scratch);

    let mut cumulative = 0.0f32;
    for &(p, id) in scratch.iter() {
        cumulative += p;
        if cumulative > coin {
            return id;
        }
    }
    // Rounding left the total just below the coin: the last kept token.
    scratch[scratch.len() - 1].1
}

/// The index of the first largest value.
fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &logit) in logits.iter().enumerate() {
        if logit > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// Divides every probability by their sum, accumulated in order.
fn renormalise(entries: &mut [(f32, u32)]) {
    let mut sum = 0.0f32;
    for &(p, _) in entries.iter() {
        sum += p;
    }
    for (p, _) in entries.iter_mut() {
        *p /= sum;
    }
}
