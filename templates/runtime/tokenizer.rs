//! Text ↔ token ids with the model's own tokenizer.json, through Hugging Face `tokenizers`.

use std::path::{Path, PathBuf};

use tokenizers::{
    DecodeStream, DecoderWrapper, ModelWrapper, NormalizerWrapper, PostProcessorWrapper,
    PreTokenizerWrapper,
};

use crate::{Error, VOCAB_SIZE, tokenizer_file};

/// The tokenizer of the model directory.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json` and checks that every id it produces has an embedding.
    pub fn load(dir: impl AsRef<Path>) -> Result<Tokenizer, Error> {
        let path = dir.as_ref().join("tokenizer.json");
        if let Err(source) = std::fs::metadata(&path) {
            return Err(Error::Io { path, source });
        }
        let (mut inner, largest) = tokenizer_file::read(&path)
            .map_err(|e| Error::Tokenizer { path: path.clone(), reason: e.to_string() })?;
        // Prompts are encoded as they are: no padding, no silent truncation.
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| Error::Tokenizer { path: path.clone(), reason: e.to_string() })?;
        // Every id the tokenizer can produce, added tokens included, needs an embedding row.
        if largest as usize >= VOCAB_SIZE {
            return Err(Error::VocabularyMismatch { path, largest, expected: VOCAB_SIZE });
        }
        Ok(Tokenizer { inner, path })
    }

    /// Encodes `text` with the tokenizer's own settings: its post-processor adds BOS where
    /// the model expects it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, Error> {
        let encoding = self.inner.encode(text, true).map_err(|e| self.error(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Decodes `ids` to text, leaving out special tokens such as BOS and EOS.
    pub fn decode(&self, ids: &[u32]) -> Result<String, Error> {
        self.inner.decode(ids, true).map_err(|e| self.error(e.to_string()))
    }

    /// An incremental decoder: feed it ids one at a time and print what it returns, and
    /// spaces and multi-byte characters come out right.
    pub fn stream(&self) -> TextStream<'_> {
        TextStream { inner: self.inner.decode_stream(true), path: &self.path }
    }

    fn error(&self, reason: String) -> Error {
        Error::Tokenizer { path: self.path.clone(), reason }
    }
}

/// Text of a growing sequence of ids, piece by piece (see [`Tokenizer::stream`]).
pub struct TextStream<'t> {
    inner: DecodeStream<
        't,
        ModelWrapper,
        NormalizerWrapper,
        PreTokenizerWrapper,
        PostProcessorWrapper,
        DecoderWrapper,
    >,
    path: &'t Path,
}

impl TextStream<'_> {
    /// Adds one id; returns the text it completes, if any (a multi-byte character may need
    /// several ids before it can be printed).
    pub fn push(&mut self, id: u32) -> Result<Option<String>, Error> {
        self.inner
            .step(id)
            .map_err(|e| Error::Tokenizer { path: self.path.to_path_buf(), reason: e.to_string() })
    }
}
