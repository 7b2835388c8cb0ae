//! Reads a tokenizer.json into a `tokenizers::Tokenizer`: the same tokenizer as
//! `Tokenizer::from_file` builds, in about half the time.
//!
//! `from_file` buffers the whole `model` object (for a 32000-token vocabulary, 32000 strings)
//! into a `serde_json::Value` to learn its `type`, then deserializes the model from that copy.
//! Here the model stays raw JSON text: its `type` is read on its own (from the first key, where
//! `tokenizers` writes it, without scanning the rest), and the deserializer of
//! that model (`BPE`, `WordPiece`, `WordLevel`, `Unigram`), the one `from_file` runs on the
//! copy, runs on the text. A model without a `type` (an old format) goes through
//! `ModelWrapper`'s deserializer, as in `from_file`. The other fields are read as
//! `TokenizerImpl`'s deserializer reads them: version 1.0 only, the model and its pipeline,
//! then the added tokens, added to the model's vocabulary.

use std::path::Path;

use serde::Deserialize;
use serde::de::{Deserializer, Error as _, MapAccess, Visitor};
use serde_json::value::RawValue;
use tokenizers::models::{bpe::BPE, unigram::Unigram, wordlevel::WordLevel, wordpiece::WordPiece};
use tokenizers::{
    AddedToken, DecoderWrapper, ModelWrapper, NormalizerWrapper, PaddingParams, PostProcessorWrapper,
    PreTokenizerWrapper, Tokenizer, TokenizerBuilder, TruncationParams,
};

/// The fields of a tokenizer.json, the model left as JSON text. Other fields are ignored, as
/// `from_file` ignores them.
#[derive(Deserialize)]
struct File<'a> {
    version: Option<String>,
    #[serde(default)]
    added_tokens: Vec<AddedTokenWithId>,
    normalizer: Option<NormalizerWrapper>,
    pre_tokenizer: Option<PreTokenizerWrapper>,
    #[serde(borrow)]
    model: &'a RawValue,
    post_processor: Option<PostProcessorWrapper>,
    decoder: Option<DecoderWrapper>,
    truncation: Option<TruncationParams>,
    padding: Option<PaddingParams>,
}

/// An entry of `added_tokens`. Its id is required, as `from_file` requires it, but the
/// vocabulary gives the id: an added token that the model lacks takes the next free one.
#[derive(Deserialize)]
struct AddedTokenWithId {
    #[serde(rename = "id")]
    _id: u32,
    #[serde(flatten)]
    token: AddedToken,
}

/// The `type` of a model object, the rest of it skipped.
#[derive(Deserialize)]
struct ModelType {
    #[serde(rename = "type")]
    name: Option<String>,
}

/// Reads a map's first entry if its key is `type`, and stops there (with an error that
/// [`model_type`] drops): the rest of the model, its whole vocabulary, is not scanned.
struct FirstKeyType<'a>(&'a mut Option<String>);

impl<'de> Visitor<'de> for FirstKeyType<'_> {
    type Value = ();

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a model object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        if map.next_key::<String>()?.as_deref() == Some("type") {
            *self.0 = map.next_value()?;
        }
        Err(A::Error::custom("read the first key only"))
    }
}

/// The model's `type`: read from the first key when it is there (`tokenizers` writes it first),
/// else from a scan of the whole object.
fn model_type(json: &str) -> serde_json::Result<Option<String>> {
    let mut first = None;
    let _stopped = serde_json::Deserializer::from_str(json).deserialize_map(FirstKeyType(&mut first));
    if first.is_some() {
        return Ok(first);
    }
    Ok(serde_json::from_str::<ModelType>(json)?.name)
}

/// Reads the tokenizer.json at `path`.
pub fn read(path: &Path) -> Result<Tokenizer, tokenizers::Error> {
    parse(&std::fs::read_to_string(path)?)
}

/// Builds the tokenizer that the JSON `text` describes.
pub fn parse(text: &str) -> Result<Tokenizer, tokenizers::Error> {
    let file: File = serde_json::from_str(text)?;
    if let Some(version) = &file.version
        && version != "1.0"
    {
        return Err(format!("Unknown tokenizer version '{version}'").into());
    }
    let json = file.model.get();
    let model: ModelWrapper = match model_type(json)?.as_deref() {
        Some("BPE") => serde_json::from_str::<BPE>(json)?.into(),
        Some("WordPiece") => serde_json::from_str::<WordPiece>(json)?.into(),
        Some("WordLevel") => serde_json::from_str::<WordLevel>(json)?.into(),
        Some("Unigram") => serde_json::from_str::<Unigram>(json)?.into(),
        _ => serde_json::from_str(json)?,
    };
    let mut tokenizer: Tokenizer = TokenizerBuilder::new()
        .with_model(model)
        .with_normalizer(file.normalizer)
        .with_pre_tokenizer(file.pre_tokenizer)
        .with_post_processor(file.post_processor)
        .with_decoder(file.decoder)
        .with_truncation(file.truncation)
        .with_padding(file.padding)
        .build()?
        .into();
    tokenizer.add_tokens(file.added_tokens.into_iter().map(|added| added.token))?;
    Ok(tokenizer)
}

/// The largest id the tokenizer can produce, added tokens included. When its n tokens hold
/// the ids 0..n, as trained vocabularies do, none can hold a larger one: n lookups settle it
/// without the copy of the whole vocabulary that `get_vocab` makes (about 4 ms of a
/// 32000-token tokenizer's load). Otherwise, that copy.
pub fn largest_id(tokenizer: &Tokenizer) -> u32 {
    let tokens = tokenizer.get_vocab_size(true);
    if let Ok(n) = u32::try_from(tokens)
        && n > 0
        && (0..n).all(|id| tokenizer.id_to_token(id).is_some())
    {
        return n - 1;
    }
    tokenizer.get_vocab(true).into_values().max().unwrap_or(0)
}
