//! Text ↔ token ids with the model's own tokenizer.json, through Hugging Face `tokenizers`.
//!
//! A prompt given as ids needs the tokenizer only to turn new ids into text: [`Tokenizer::load`]
//! reads just that (`detokenizer.rs`: the pieces by id, the added tokens, the decoder), a
//! quarter of the time of building the whole tokenizer, which it builds only if a text is
//! encoded. [`Tokenizer::load_with_encoder`] builds the whole tokenizer at once, for a text
//! prompt, and decodes with it.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::detokenizer::{self, DecodeStream, Detokenizer};
use crate::{Error, VOCAB_SIZE, tokenizer_file};

/// The tokenizer of the model directory.
pub struct Tokenizer {
    /// tokenizer.json, for an encoder built later.
    text: String,
    /// What decodes, unless the encoder does.
    detokenizer: Option<Detokenizer>,
    /// The whole tokenizer, built by the first [`Tokenizer::encode`] (or the reason it could
    /// not be).
    encoder: OnceLock<Result<tokenizers::Tokenizer, String>>,
    path: PathBuf,
}

impl Tokenizer {
    /// Loads what decodes `dir/tokenizer.json`'s ids, and checks that every id it produces has
    /// an embedding. The whole tokenizer is built if [`Tokenizer::encode`] is called, and what
    /// only it checks (the model's merges, scores and unknown token) is checked then.
    pub fn load(dir: impl AsRef<Path>) -> Result<Tokenizer, Error> {
        let (path, text) = read(dir.as_ref())?;
        let (detokenizer, largest) = detokenizer::read(&text)
            .map_err(|e| Error::Tokenizer { path: path.clone(), reason: e.to_string() })?;
        check_largest(&path, largest)?;
        Ok(Tokenizer { text, detokenizer: Some(detokenizer), encoder: OnceLock::new(), path })
    }

    /// Loads the whole tokenizer of `dir/tokenizer.json`, which encodes and decodes, and checks
    /// that every id it produces has an embedding.
    pub fn load_with_encoder(dir: impl AsRef<Path>) -> Result<Tokenizer, Error> {
        let (path, text) = read(dir.as_ref())?;
        let (encoder, largest) =
            build_encoder(&text).map_err(|reason| Error::Tokenizer { path: path.clone(), reason })?;
        check_largest(&path, largest)?;
        Ok(Tokenizer { text, detokenizer: None, encoder: OnceLock::from(Ok(encoder)), path })
    }

    /// Encodes `text` with the tokenizer's own settings: its post-processor adds BOS where
    /// the model expects it.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, Error> {
        let encoding = self.encoder()?.encode(text, true).map_err(|e| self.error(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Encodes `text` as it is, without the special tokens the post-processor adds: a chat
    /// template writes its own.
    pub fn encode_as_is(&self, text: &str) -> Result<Vec<u32>, Error> {
        let encoding = self.encoder()?.encode(text, false).map_err(|e| self.error(e.to_string()))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Decodes `ids` to text, leaving out special tokens such as BOS and EOS.
    pub fn decode(&self, ids: &[u32]) -> Result<String, Error> {
        self.decode_text(ids).map_err(|reason| self.error(reason))
    }

    /// An incremental decoder: feed it ids one at a time and print what it returns, and
    /// spaces and multi-byte characters come out right.
    pub fn stream(&self) -> TextStream<'_> {
        TextStream { tokenizer: self, state: DecodeStream::default() }
    }

    fn decode_text(&self, ids: &[u32]) -> Result<String, String> {
        let decoded = match &self.detokenizer {
            Some(detokenizer) => detokenizer.decode(ids, true),
            None => self.encoder().map_err(|e| e.to_string())?.decode(ids, true),
        };
        decoded.map_err(|e| e.to_string())
    }

    fn encoder(&self) -> Result<&tokenizers::Tokenizer, Error> {
        let encoder = self.encoder.get_or_init(|| build_encoder(&self.text).map(|(encoder, _)| encoder));
        encoder.as_ref().map_err(|reason| self.error(reason.clone()))
    }

    fn error(&self, reason: String) -> Error {
        Error::Tokenizer { path: self.path.clone(), reason }
    }
}

/// `dir/tokenizer.json` and its text.
fn read(dir: &Path) -> Result<(PathBuf, String), Error> {
    let path = dir.join("tokenizer.json");
    match std::fs::read_to_string(&path) {
        Ok(text) => Ok((path, text)),
        Err(source) => Err(Error::Io { path, source }),
    }
}

/// The whole tokenizer of the JSON `text`, set to encode prompts as they are (no padding, no
/// silent truncation), and the largest id it produces.
fn build_encoder(text: &str) -> Result<(tokenizers::Tokenizer, u32), String> {
    let (mut tokenizer, largest) = tokenizer_file::parse(text).map_err(|e| e.to_string())?;
    tokenizer.with_padding(None);
    tokenizer.with_truncation(None).map_err(|e| e.to_string())?;
    Ok((tokenizer, largest))
}

/// Every id the tokenizer can produce, added tokens included, needs an embedding row.
fn check_largest(path: &Path, largest: u32) -> Result<(), Error> {
    if largest as usize >= VOCAB_SIZE {
        return Err(Error::VocabularyMismatch { path: path.to_path_buf(), largest, expected: VOCAB_SIZE });
    }
    Ok(())
}

/// Text of a growing sequence of ids, piece by piece (see [`Tokenizer::stream`]).
pub struct TextStream<'t> {
    tokenizer: &'t Tokenizer,
    state: DecodeStream,
}

impl TextStream<'_> {
    /// Adds one id; returns the text it completes, if any (a multi-byte character may need
    /// several ids before it can be printed).
    pub fn push(&mut self, id: u32) -> Result<Option<String>, Error> {
        let tokenizer = self.tokenizer;
        self.state.step(id, |ids| tokenizer.decode_text(ids)).map_err(|reason| tokenizer.error(reason))
    }
}
