//! Turns token ids back into text as the tokenizer.json's own tokenizer would, without building
//! that tokenizer: for a prompt given as ids, decoding is all a crate needs of it.
//!
//! [`read`] keeps the model's vocabulary as a table of pieces by id (no maps, no merges), puts
//! the added tokens in `tokenizers`' own `AddedVocabulary` (which gives them their ids and
//! normalized forms as the tokenizer does) and reads the decoder. [`Detokenizer::decode`] then
//! decodes as `Tokenizer::decode` does, and [`DecodeStream`] streams as `DecodeStream` does.
//! Reading a 32000-piece vocabulary this way takes 2-4 ms, against 8-9 ms for the whole
//! tokenizer (`tokenizer_file::parse`) and 15-17 ms for `Tokenizer::from_file` (on an Intel
//! Xeon). The vocabulary's entries are read in the same pass as the rest of the model object,
//! and each piece is looked up among the added tokens' contents by a binary search rather than
//! a hash: on an AMD EPYC (Zen 3), where the whole read took 9.5-10 ms, that made it 7.5-8.
//!
//! No model is built, so what only the model's own reader checks is not checked here: its
//! merges, its scores, its unknown token. A model `type` must be one of the four. Where the
//! two differ on files no library writes: a vocabulary that gives a piece twice keeps both ids
//! here (the model keeps the last and counts it once, which also moves the ids of added tokens
//! missing from the vocabulary), and a model object with two `vocab` fields is refused.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
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
    let mut contents: Vec<&str> = file.added_tokens.iter().map(|a| a.token.content.as_str()).collect();
    contents.sort_unstable();
    let pieces = Pieces::new(serde_json::from_str::<PiecesOf>(file.model.get())?.entries()?, &contents);
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
    /// The pieces of the ids below the vocabulary's dense range's end.
    by_id: Vec<Option<String>>,
    /// Pieces of ids far past the others (a hand-edited file), kept apart so that a huge id
    /// costs no huge table: it then fails the crate's check against its embedding rows.
    far: HashMap<u32, String>,
    /// Entries of the vocabulary (`get_vocab_size`, as the model counts them).
    entries: usize,
    largest: Option<u32>,
    /// The ids of the added tokens' contents that the vocabulary holds.
    ids_of_added: HashMap<String, u32>,
}

impl Pieces {
    /// The vocabulary of `(piece, id)` entries in file order, `added` the added tokens'
    /// contents, sorted. Ids below twice the entries (and 1024 more) go in a table, others
    /// apart.
    fn new(entries: Vec<(String, u32)>, added: &[&str]) -> Pieces {
        let dense = 2 * entries.len() + 1024;
        let largest = entries.iter().map(|&(_, id)| id).max();
        let table = largest.map_or(0, |l| (l as usize + 1).min(dense));
        let mut pieces = Pieces {
            by_id: vec![None; table],
            far: HashMap::new(),
            entries: entries.len(),
            largest,
            ids_of_added: HashMap::new(),
        };
        for (piece, id) in entries {
            // A binary search of the few added contents: no hash of every piece.
            if added.binary_search(&piece.as_str()).is_ok() {
                pieces.ids_of_added.insert(piece.clone(), id);
            }
            match pieces.by_id.get_mut(id as usize) {
                Some(slot) => *slot = Some(piece),
                None => {
                    pieces.far.insert(id, piece);
                }
            }
        }
        pieces
    }
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
        match self.by_id.get(id as usize) {
            Some(piece) => piece.clone(),
            None => self.far.get(&id).cloned(),
        }
    }

    fn get_vocab(&self) -> HashMap<String, u32> {
        let pieces =
            self.by_id.iter().enumerate().filter_map(|(id, piece)| Some((piece.clone()?, id as u32)));
        pieces.chain(self.far.iter().map(|(&id, piece)| (piece.clone(), id))).collect()
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

/// A model object's `type` and `vocab`, the vocabulary read as `(piece, id)` entries in the
/// same pass as the rest of the object.
#[derive(Deserialize)]
struct PiecesOf {
    #[serde(rename = "type")]
    name: Option<String>,
    vocab: Option<Entries>,
}

impl PiecesOf {
    /// The vocabulary's entries, once the model's type is known to be one of the four.
    fn entries(self) -> Result<Vec<(String, u32)>, tokenizers::Error> {
        if let Some(name) = &self.name
            && !["BPE", "WordPiece", "WordLevel", "Unigram"].contains(&name.as_str())
        {
            return Err(format!("unknown model type `{name}`").into());
        }
        Ok(self.vocab.ok_or("the model has no `vocab`")?.0)
    }
}

/// A vocabulary's `(piece, id)` entries in file order: an object of piece → id, or
/// Unigram's list of `[piece, score]`, whose ids are the places in the list.
struct Entries(Vec<(String, u32)>);

impl<'de> Deserialize<'de> for Entries {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Entries, D::Error> {
        deserializer.deserialize_any(EntriesVisitor)
    }
}

struct EntriesVisitor;

impl<'de> Visitor<'de> for EntriesVisitor {
    type Value = Entries;

    fn expecting(&self, formatter: &mut std::fmt::Formatter) -> std::fmt::Result {
        formatter.write_str("a vocabulary")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entries, A::Error> {
        let mut entries = Vec::with_capacity(map.size_hint().unwrap_or(0));
        while let Some(entry) = map.next_entry::<String, u32>()? {
            entries.push(entry);
        }
        Ok(Entries(entries))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Entries, A::Error> {
        let mut entries = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some((piece, _score)) = seq.next_element::<(String, f64)>()? {
            let id = entries.len() as u32;
            entries.push((piece, id));
        }
        Ok(Entries(entries))
    }
}
