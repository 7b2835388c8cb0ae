//! Reads a tokenizer.json into a `tokenizers::Tokenizer`: the same tokenizer as
//! `Tokenizer::from_file` builds, in about half the time.
//!
//! `from_file` buffers the whole `model` object (for a 32000-token vocabulary, 32000 strings)
//! into a `serde_json::Value` to learn its `type`, then deserializes the model from that copy.
//! Here the model stays raw JSON text: one scan reads its `type` and its vocabulary's largest
//! id (so that no lookup of every id is needed to check them against the model), and the
//! deserializer of that model (`BPE`, `WordPiece`, `WordLevel`, `Unigram`), the one
//! `from_file` runs on the copy, runs on the text. A model without a `type` (an old format)
//! goes through `ModelWrapper`'s deserializer, as in `from_file`. The other fields are read as
//! `TokenizerImpl`'s deserializer reads them: version 1.0 only, the model and its pipeline,
//! then the added tokens, added to the model's vocabulary.
//!
//! `detokenizer.rs` reads the same fields ([`File`]) for decoding only.
//!
//! Where the two differ, on files no tokenizer library writes: this reader skips an unknown
//! top-level field (`from_file` fails on it, reading its key but not its value) and takes a
//! null `version` for none, and it refuses a top-level field given twice (`from_file` keeps
//! the last) and a model `type` written with escapes.

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use tokenizers::models::{bpe::BPE, unigram::Unigram, wordlevel::WordLevel, wordpiece::WordPiece};
use tokenizers::{
    AddedToken, DecoderWrapper, ModelWrapper, NormalizerWrapper, PaddingParams, PostProcessorWrapper,
    PreTokenizerWrapper, Tokenizer, TokenizerBuilder, TruncationParams,
};

/// The fields of a tokenizer.json, the model left as JSON text. Other fields are skipped.
#[derive(Deserialize)]
pub(crate) struct File<'a> {
    pub(crate) version: Option<String>,
    #[serde(default)]
    pub(crate) added_tokens: Vec<AddedTokenWithId>,
    pub(crate) normalizer: Option<NormalizerWrapper>,
    pub(crate) pre_tokenizer: Option<PreTokenizerWrapper>,
    #[serde(borrow)]
    pub(crate) model: &'a RawValue,
    pub(crate) post_processor: Option<PostProcessorWrapper>,
    pub(crate) decoder: Option<DecoderWrapper>,
    pub(crate) truncation: Option<TruncationParams>,
    pub(crate) padding: Option<PaddingParams>,
}

impl<'a> File<'a> {
    /// Reads the fields of `text`, refusing a version other than 1.0.
    pub(crate) fn read(text: &'a str) -> Result<File<'a>, tokenizers::Error> {
        // `tokenizers`' deserializers of the pipeline's parts (`DecoderWrapper` and others)
        // panic on malformed JSON inside their object (`expect("Helper")` in tokenizers 0.23; the
        // input is in fuzz/regressions/tokenizer/). The whole text read as JSON first, such a
        // file is an error here instead.
        serde_json::from_str::<IgnoredAny>(text)?;
        let file: File = serde_json::from_str(text)?;
        if let Some(version) = &file.version
            && version != "1.0"
        {
            return Err(format!("Unknown tokenizer version '{version}'").into());
        }
        if let Some(post_processor) = &file.post_processor {
            check_templates(&serde_json::to_value(post_processor)?)?;
        }
        Ok(file)
    }
}

/// `tokenizers` checks that the special tokens a `TemplateProcessing` places exist, each with
/// as many tokens as ids, when its builder makes one, but not when a file is read: encoding
/// with a missing one then panics (an index into its map; the input is in
/// fuzz/regressions/tokenizer/). So the templates a file's post-processor (`post`, as JSON)
/// holds, in a `Sequence` too, are checked here.
fn check_templates(post: &serde_json::Value) -> Result<(), tokenizers::Error> {
    match post["type"].as_str() {
        Some("TemplateProcessing") => {
            let known = post["special_tokens"].as_object();
            for token in known.into_iter().flat_map(|tokens| tokens.values()) {
                let count = |field: &str| token[field].as_array().map_or(0, Vec::len);
                if count("ids") != count("tokens") {
                    return Err(format!(
                        "post_processor: special token `{}` has {} ids and {} tokens",
                        token["id"].as_str().unwrap_or_default(),
                        count("ids"),
                        count("tokens")
                    )
                    .into());
                }
            }
            let pieces =
                ["single", "pair"].into_iter().flat_map(|t| post[t].as_array().into_iter().flatten());
            for id in pieces.filter_map(|piece| piece["SpecialToken"]["id"].as_str()) {
                if !known.is_some_and(|tokens| tokens.contains_key(id)) {
                    return Err(format!(
                        "post_processor: its template places `{id}`, which is not among its special_tokens"
                    )
                    .into());
                }
            }
            Ok(())
        }
        Some("Sequence") => post["processors"].as_array().into_iter().flatten().try_for_each(check_templates),
        _ => Ok(()),
    }
}

/// An entry of `added_tokens`. Its id is required, as `from_file` requires it, but the
/// vocabulary gives the id: an added token that the model lacks takes the next free one.
#[derive(Deserialize)]
pub(crate) struct AddedTokenWithId {
    #[serde(rename = "id")]
    _id: u32,
    #[serde(flatten)]
    pub(crate) token: AddedToken,
}

/// What one scan of a model object's text tells, before anything is built: its `type`, and
/// the largest id of its vocabulary (`vocab`: an object of token → id, or a list whose
/// indices are the ids, as Unigram's). A model produces only ids of its vocabulary.
#[derive(Default)]
struct ModelSummary {
    name: Option<String>,
    largest: Option<u32>,
}

impl<'de> Deserialize<'de> for ModelSummary {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<ModelSummary, D::Error> {
        deserializer.deserialize_map(SummaryVisitor)
    }
}

struct SummaryVisitor;

impl<'de> Visitor<'de> for SummaryVisitor {
    type Value = ModelSummary;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a model object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ModelSummary, A::Error> {
        let mut summary = ModelSummary::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "type" => summary.name = map.next_value()?,
                "vocab" => summary.largest = map.next_value::<LargestId>()?.0,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(summary)
    }
}

/// The largest id of a vocabulary, read without keeping its tokens.
struct LargestId(Option<u32>);

impl<'de> Deserialize<'de> for LargestId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<LargestId, D::Error> {
        deserializer.deserialize_any(LargestIdVisitor)
    }
}

struct LargestIdVisitor;

impl<'de> Visitor<'de> for LargestIdVisitor {
    type Value = LargestId;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a vocabulary")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LargestId, A::Error> {
        let mut largest = None;
        while let Some((IgnoredAny, id)) = map.next_entry::<IgnoredAny, u32>()? {
            largest = largest.max(Some(id));
        }
        Ok(LargestId(largest))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<LargestId, A::Error> {
        let mut len = 0u32;
        while seq.next_element::<IgnoredAny>()?.is_some() {
            len = len.saturating_add(1);
        }
        Ok(LargestId(len.checked_sub(1)))
    }
}

/// The model's summary, or, for a model this scan does not understand (the model's own
/// deserializer then decides), just its `type`.
fn summary(json: &str) -> serde_json::Result<ModelSummary> {
    #[derive(Deserialize)]
    struct ModelType {
        #[serde(rename = "type")]
        name: Option<String>,
    }
    match serde_json::from_str::<ModelSummary>(json) {
        Ok(summary) => Ok(summary),
        Err(_) => Ok(ModelSummary { name: serde_json::from_str::<ModelType>(json)?.name, largest: None }),
    }
}

/// Builds the tokenizer that the JSON `text` (a tokenizer.json) describes, and the largest id
/// its model and added tokens can produce (a post-processor's own special-token ids are not
/// among them: the session checks every id of a prompt): the larger of its vocabulary's largest
/// (from the scan that also reads the model's `type`) and its added tokens' largest, or, where the scan found no vocabulary, [`largest_id`].
pub fn parse(text: &str) -> Result<(Tokenizer, u32), tokenizers::Error> {
    let file = File::read(text)?;
    let json = file.model.get();
    let summary = summary(json)?;
    let model: ModelWrapper = match summary.name.as_deref() {
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
    let added = tokenizer.get_added_vocabulary().get_added_tokens_decoder().keys().max().copied();
    let largest = match summary.largest {
        Some(vocabulary) => vocabulary.max(added.unwrap_or(0)),
        None => largest_id(&tokenizer),
    };
    Ok((tokenizer, largest))
}

/// The largest id the tokenizer can produce, added tokens included, for a model whose
/// vocabulary the scan could not read. When its n tokens hold the ids 0..n, as trained
/// vocabularies do, none can hold a larger one: n lookups settle it (1.5 ms for 32000 tokens)
/// without the copy of the whole vocabulary that `get_vocab` makes. Otherwise, that copy.
fn largest_id(tokenizer: &Tokenizer) -> u32 {
    let tokens = tokenizer.get_vocab_size(true);
    if let Ok(n) = u32::try_from(tokens)
        && n > 0
        && (0..n).all(|id| tokenizer.id_to_token(id).is_some())
    {
        return n - 1;
    }
    tokenizer.get_vocab(true).into_values().max().unwrap_or(0)
}
