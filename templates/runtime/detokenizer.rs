//! Turns token ids back into text as the tokenizer.json's own tokenizer would, without building
//! that tokenizer: for a prompt given as ids, decoding is all a crate needs of it.
//!
//! [`read`] keeps the model's vocabulary as a table of pieces by id (no maps, no merges), puts
//! the added tokens in `tokenizers`' own `AddedVocabulary` (which gives them their ids and
//! normalized forms as the tokenizer does) and reads the decoder. [`Detokenizer::decode`] then
//! decodes as `Tokenizer::decode` does, and [`DecodeStream`] streams as `DecodeStream` does.
//! Reading a 32000-piece vocabulary this way takes 2-4 ms, against 8-9 ms for the whole
//! tokenizer (`tokenizer_file::parse`) and 15-17 ms for `Tokenizer::from_file`.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use tokenizers::models::wordlevel::WordLevelTrainer;
use tokenizers::{AddedVocabulary, Decoder, DecoderWrapper, Model, Token};

use crate::tokenizer_file::File;

/// What turns ids back into text, as the tokenizer of the same file would: the model's
/// pieces by id, the added tokens and the decoder.
pub struct Detokenizer {
    pieces: Pieces,
    added: AddedVocabulary,
    decoder: Option<DecoderWrapper>,
}

impl Detokenizer {
    /// The text of `ids`, as `Tokenizer::decode` gives it: each id's added token or piece
    /// (an id with neither is left out), special tokens left out if `skip_special_tokens`,
    /// then the decoder (or the pieces joined by spaces, without one).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, tokenizers::Error> {
        let tokens: Vec<String> = ids
            .iter()
            .filter_map(|&id| {
                self.added
                    .simple_id_to_token(id)
                    .or_else(|| self.pieces.id_to_token(id))
                    .filter(|token| !skip_special_tokens || !self.added.is_special_token(token))
            })
            .collect();
        match &self.decoder {
            Some(decoder) => decoder.decode(tokens),
            None => Ok(tokens.join(" ")),
        }
    }
}

/// Text of a growing sequence of ids, piece by piece, as `tokenizers`' `DecodeStream` gives
/// it: the ids since the last complete piece are decoded again with each new one (by the
/// caller's `decode`: a [`Detokenizer`]'s, or a whole tokenizer's), and what their text gained
/// past the text already returned is new (nothing while it ends in an incomplete character).
#[derive(Default)]
pub struct DecodeStream {
    /// The ids from the start of the last returned piece.
    ids: Vec<u32>,
    /// The text of `ids[..prefix_index]`, already returned.
    prefix: String,
    prefix_index: usize,
}

impl DecodeStream {
    /// Adds `id`; returns the text it completes, if any, or why it cannot.
    pub fn step(
        &mut self,
        id: u32,
        decode: impl Fn(&[u32]) -> Result<String, String>,
    ) -> Result<Option<String>, String> {
        if self.prefix.is_empty() && !self.ids.is_empty() {
            let prefix = decode(&self.ids)?;
            if !prefix.ends_with('\u{FFFD}') {
                self.prefix = prefix;
                self.prefix_index = self.ids.len();
            }
        }
        self.ids.push(id);
        let text = decode(&self.ids)?;
        if text.len() <= self.prefix.len() || text.ends_with('\u{FFFD}') {
            return Ok(None);
        }
        let Some(new) = text.strip_prefix(self.prefix.as_str()) else {
            return Err(format!(
                "decoding id {id} changed the text returned before it ({:?} is now {text:?})",
                self.prefix
            ));
        };
        let new = new.to_string();
        let new_prefix_index = self.ids.len() - self.prefix_index;
        self.ids.drain(..self.prefix_index);
        self.prefix = decode(&self.ids)?;
        self.prefix_index = new_prefix_index;
        Ok(Some(new))
    }
}

/// Reads what [`Detokenizer`] needs from the tokenizer.json `text`, and the largest id the
/// tokenizer can produce (as `tokenizer_file::parse` finds it). The rest of the pipeline is
/// read too, so that a file `parse` refuses for a broken normalizer or decoder is refused here
/// as well; the model's own fields (merges, scores) are not, as no model is built.
pub fn read(text: &str) -> Result<(Detokenizer, u32), tokenizers::Error> {
    let file = File::read(text)?;
    let contents: HashSet<&str> = file.added_tokens.iter().map(|a| a.token.content.as_str()).collect();
    let pieces = serde_json::from_str::<PiecesOf>(file.model.get())?.read(&contents)?;
    let mut added = AddedVocabulary::new();
    added.add_tokens(file.added_tokens.into_iter().map(|a| a.token), &pieces, file.normalizer.as_ref())?;
    let added_largest = added.get_added_tokens_decoder().keys().max().copied();
    let largest = pieces.largest.max(added_largest).unwrap_or(0);
    Ok((Detokenizer { pieces, added, decoder: file.decoder }, largest))
}

/// A model's vocabulary as pieces by id: a model that only answers what decoding and the added
/// vocabulary ask (`id_to_token`; `token_to_id` of the added tokens' contents; the vocabulary's
/// size), so that no map of the whole vocabulary is built.
struct Pieces {
    by_id: Vec<Option<String>>,
    /// Entries of the vocabulary (`get_vocab_size`, as the model counts them).
    entries: usize,
    largest: Option<u32>,
    /// The ids of the added tokens' contents that the vocabulary holds.
    ids_of_added: HashMap<String, u32>,
}

impl Model for Pieces {
    type Trainer = WordLevelTrainer;

    fn tokenize(&self, _sequence: &str) -> tokenizers::Result<Vec<Token>> {
        Err("a vocabulary read for decoding does not tokenize".into())
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.ids_of_added.get(token).copied()
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        self.by_id.get(id as usize).cloned().flatten()
    }

    fn get_vocab(&self) -> HashMap<String, u32> {
        let pieces = self.by_id.iter().enumerate();
        pieces.filter_map(|(id, piece)| Some((piece.clone()?, id as u32))).collect()
    }

    fn get_vocab_size(&self) -> usize {
        self.entries
    }

    fn save(&self, _folder: &Path, _prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        Err("a vocabulary read for decoding is not saved".into())
    }

    fn get_trainer(&self) -> WordLevelTrainer {
        WordLevelTrainer::default()
    }
}

/// A model object's `vocab`, kept as text until the added tokens' contents are known.
#[derive(Deserialize)]
struct PiecesOf<'a> {
    #[serde(borrow)]
    vocab: Option<&'a RawValue>,
}

impl PiecesOf<'_> {
    fn read(&self, added: &HashSet<&str>) -> Result<Pieces, tokenizers::Error> {
        let vocab = self.vocab.ok_or("the model has no `vocab`")?;
        let mut deserializer = serde_json::Deserializer::from_str(vocab.get());
        Ok(PiecesSeed { added }.deserialize(&mut deserializer)?)
    }
}

/// Reads a vocabulary (an object of piece → id, or Unigram's list of `[piece, score]`).
struct PiecesSeed<'s> {
    added: &'s HashSet<&'s str>,
}

impl<'de> DeserializeSeed<'de> for PiecesSeed<'_> {
    type Value = Pieces;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Pieces, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for PiecesSeed<'_> {
    type Value = Pieces;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a vocabulary")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Pieces, A::Error> {
        let mut pieces = Pieces {
            by_id: Vec::with_capacity(map.size_hint().unwrap_or(0)),
            entries: 0,
            largest: None,
            ids_of_added: HashMap::new(),
        };
        while let Some((piece, id)) = map.next_entry::<String, u32>()? {
            if self.added.contains(piece.as_str()) {
                pieces.ids_of_added.insert(piece.clone(), id);
            }
            let at = id as usize;
            if pieces.by_id.len() <= at {
                pieces.by_id.resize(at + 1, None);
            }
            pieces.by_id[at] = Some(piece);
            pieces.entries += 1;
            pieces.largest = pieces.largest.max(Some(id));
        }
        Ok(pieces)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Pieces, A::Error> {
        let mut pieces = Pieces {
            by_id: Vec::with_capacity(seq.size_hint().unwrap_or(0)),
            entries: 0,
            largest: None,
            ids_of_added: HashMap::new(),
        };
        while let Some((piece, _score)) = seq.next_element::<(String, f64)>()? {
            let id = pieces.by_id.len() as u32;
            if self.added.contains(piece.as_str()) {
                pieces.ids_of_added.insert(piece.clone(), id);
            }
            pieces.by_id.push(Some(piece));
        }
        pieces.entries = pieces.by_id.len();
        pieces.largest = pieces.entries.checked_sub(1).map(|last| last as u32);
        Ok(pieces)
    }
}
