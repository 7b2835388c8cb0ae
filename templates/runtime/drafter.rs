//! The draft model's side of speculative decoding: the draft model is a crate of its own
//! (draft/, the dependency `draft_model`), generated from the workload's `[speculation.draft]`
//! with the target's tokenizer. A session of it follows the target's sequence and drafts the
//! tokens it would pick greedily; the target verifies them all in one pass and keeps those it
//! picks itself, so the output is the target's alone.

use std::path::{Path, PathBuf};

use crate::Error;

/// Loads the draft model for the target model in `dir`: from `dir/draft/` where it holds a
/// checkpoint (a model of its own, whose tokenizer.json must be `dir`'s byte for byte), else
/// from `dir` itself (the target's checkpoint, which the draft model holds as its workload
/// says, e.g. quantized).
pub(crate) fn load(dir: &Path) -> Result<draft_model::Model, Error> {
    let own = dir.join("draft");
    let has_checkpoint =
        own.join("model.safetensors").is_file() || own.join("model.safetensors.index.json").is_file();
    let from = if has_checkpoint {
        same_tokenizer(dir, &own)?;
        own
    } else {
        dir.to_path_buf()
    };
    draft_model::Model::load(&from).map_err(|e| match e {
        draft_model::Error::UnsupportedCpu { missing, workload } => Error::UnsupportedCpu { missing, workload },
        other => Error::InvalidWeights { path: from.clone(), reason: format!("the draft model: {other}") },
    })
}

/// Refuses a draft model whose tokenizer.json is not the target's: its ids would mean other
/// text. Neither having one (prompts given as ids) is no difference.
fn same_tokenizer(dir: &Path, draft: &Path) -> Result<(), Error> {
    let (target, own): (PathBuf, PathBuf) = (dir.join("tokenizer.json"), draft.join("tokenizer.json"));
    let read = |path: &Path| match std::fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(Error::Io { path: path.to_path_buf(), source }),
    };
    let (a, b) = (read(&target)?, read(&own)?);
    if a == b {
        return Ok(());
    }
    let reason = match (&a, &b) {
        (Some(_), None) => format!("the draft model has none, and the target's is {}", target.display()),
        (None, Some(_)) => format!("the target model has none ({}) to compare it with", target.display()),
        _ => format!("it differs from the target's ({}): a draft model's ids must mean the target's text", target.display()),
    };
    Err(Error::Tokenizer { path: own, reason })
}

/// A session of the draft model and the tokens its cache holds.
pub(crate) struct Drafter<'m> {
    session: draft_model::Session<'m>,
    held: Vec<u32>,
}

impl<'m> Drafter<'m> {
    pub(crate) fn new(model: &'m draft_model::Model) -> Drafter<'m> {
        Drafter { session: model.session(), held: Vec::new() }
    }

    /// Appends to `out` at most `max` tokens that the draft model picks greedily after
    /// `context` (the target's sequence so far): it keeps the positions its cache shares with
    /// `context` (the kept drafts of the last step among them), runs the rest of `context`
    /// (at least its last token, whose logits pick the first draft), then decodes each draft to
    /// pick the next. Returns the positions the draft model ran.
    pub(crate) fn draft(&mut self, context: &[u32], max: usize, out: &mut Vec<u32>) -> Result<usize, Error> {
        if max == 0 || context.is_empty() {
            return Ok(0);
        }
        let keep = self.held.iter().zip(context).take_while(|(a, b)| a == b).count().min(context.len() - 1);
        self.session.rewind(keep);
        self.held.truncate(keep);
        let mut next = greedy(self.session.prefill(&context[keep..]).map_err(run_error)?);
        self.held.extend_from_slice(&context[keep..]);
        out.push(next);
        for _ in 1..max {
            let logits = self.session.decode(next).map_err(run_error)?;
            self.held.push(next);
            next = greedy(logits);
            out.push(next);
        }
        Ok(context.len() - keep + max - 1)
    }
}

/// The most likely token (the lowest id among equals).
fn greedy(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// An error of the draft model's session: the target checked the sequence, so this is the
/// draft model's own limit.
fn run_error(e: draft_model::Error) -> Error {
    Error::InvalidParameter { name: "draft model", reason: e.to_string() }
}
