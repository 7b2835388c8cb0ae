//! Text → token ids with the model's own tokenizer.json, through Hugging Face `tokenizers`.
//!
//! The tokenizer adds [CLS] and [SEP] as its post-processor says. It does not pad (the
//! encoder pads each batch to its longest sentence itself), and it truncates to its own
//! maximum length or to MAX_SEQ_LEN, whichever is shorter.

use std::path::{Path, PathBuf};

use tokenizers::TruncationParams;

use crate::{Error, MAX_SEQ_LEN, VOCAB_SIZE, tokenizer_file};

/// The tokenizer of the model directory.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
    max_len: usize,
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json` and checks that every id it produces has an embedding.
    pub fn load(dir: impl AsRef<Path>) -> Result<Tokenizer, Error> {
        let path = dir.as_ref().join("tokenizer.json");
        let text =
            std::fs::read_to_string(&path).map_err(|source| Error::Io { path: path.clone(), source })?;
        let fail = |e: tokenizers::Error| Error::Tokenizer { path: path.clone(), reason: e.to_string() };
        let (mut inner, largest) = tokenizer_file::parse(&text).map_err(fail)?;
        inner.with_padding(None);
        let truncation = inner.get_truncation().cloned().unwrap_or_default();
        let max_len = if inner.get_truncation().is_some() {
            truncation.max_length.min(MAX_SEQ_LEN)
        } else {
            MAX_SEQ_LEN
        };
        inner.with_truncation(Some(TruncationParams { max_length: max_len, ..truncation })).map_err(fail)?;
        // Every id the tokenizer can produce, added tokens included, needs an embedding row.
        if largest as usize >= VOCAB_SIZE {
            return Err(Error::VocabularyMismatch { path, largest, expected: VOCAB_SIZE });
        }
        Ok(Tokenizer { inner, path, max_len })
    }

    /// The most tokens a sentence keeps, [CLS] and [SEP] included.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// Encodes `text` with [CLS] and [SEP], truncated to [`Tokenizer::max_len`]. An empty
    /// string is a sentence too: [CLS] [SEP].
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, Error> {
        Ok(self.encoding(text)?.get_ids().to_vec())
    }

    /// Encodes `text` as [`Tokenizer::encode`] does, or `None` where it is longer than
    /// [`Tokenizer::max_len`] tokens (which `encode` truncates): the server refuses it.
    pub fn encode_whole(&self, text: &str) -> Result<Option<Vec<u32>>, Error> {
        let encoding = self.encoding(text)?;
        Ok(encoding.get_overflowing().is_empty().then(|| encoding.get_ids().to_vec()))
    }

    fn encoding(&self, text: &str) -> Result<tokenizers::Encoding, Error> {
        self.inner.encode(text, true).map_err(|e| Error::Tokenizer { path: self.path.clone(), reason: e.to_string() })
    }
}
