//! Turns token ids back into text as the tokenizer.json's own tokenizer would, without building
//! that tokenizer: for a prompt given as ids, decoding is all a crate needs of it.
//!
//! [`read`] keeps the model's vocabulary as a table of pieces by id (no maps, no merges), puts
//! the added tokens in `tokenizers`' own `AddedVocabulary` (which gives them their ids and
//! normalized forms as the tokenizer does) and reads the decoder. [`Detokenizer::decode`] then
//! decodes as `Tokenizer::decode` does, and [`DecodeStream`] streams as `DecodeStream` does.
//!
//! The vocabulary is read by a scan of its own ([`Pieces::scan`]) into one string of all the
//! pieces, with no string allocated per piece, and each piece is looked up among the added
//! tokens' contents only when its first byte starts one. Forms the scan does not take are read
//! by `serde_json`. On an AMD EPYC (Zen 3), [`read`] takes 2.5-3 ms on a 32000-piece
//! tokenizer.json this way, against 4.3-5 ms with a string allocated per piece.
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
    // Every piece lies in `text`, escaped or not, so that bounds in `u32` hold every piece.
    if u32::try_from(text.len()).is_err() {
        return Err("a tokenizer.json of 4 GiB or more".into());
    }
    let file = File::read(text)?;
    let mut contents: Vec<&str> = file.added_tokens.iter().map(|a| a.token.content.as_str()).collect();
    contents.sort_unstable();
    let pieces = match Pieces::scan(file.model.get(), &contents) {
        Some(pieces) => pieces,
        None => Pieces::read(file.model.get(), &contents)?,
    };
    let mut added = AddedVocabulary::new();
    added.add_tokens(file.added_tokens.into_iter().map(|a| a.token), &pieces, file.normalizer.as_ref())?;
    let added_largest = added.get_added_tokens_decoder().keys().max().copied();
    let largest = pieces.largest.max(added_largest).unwrap_or(0);
    Ok((Detokenizer { pieces, added, decoder: file.decoder }, largest))
}

/// A reader of JSON that `serde_json` has checked, for [`Pieces::scan`]: each method reads
/// one thing at `at` (after any whitespace) and returns `None` where it finds another.
struct Scanner<'a> {
    text: &'a str,
    at: usize,
}

impl<'a> Scanner<'a> {
    /// The next byte past whitespace, not consumed.
    fn peek(&mut self) -> Option<u8> {
        let bytes = self.text.as_bytes();
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = bytes.get(self.at) {
            self.at += 1;
        }
        bytes.get(self.at).copied()
    }

    /// Consumes `byte` if it comes next.
    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// A string's contents between its quotes, as written, and whether it holds escapes.
    fn string(&mut self) -> Option<(&'a str, bool)> {
        self.eat(b'"')?;
        let bytes = self.text.as_bytes();
        let (start, mut escaped) = (self.at, false);
        // Valid JSON: the byte after a backslash is no quote that ends the string.
        loop {
            match *bytes.get(self.at)? {
                b'"' => break,
                b'\\' => {
                    escaped = true;
                    self.at += 2;
                }
                _ => self.at += 1,
            }
        }
        self.at += 1;
        // Both ends are ASCII quotes, so at boundaries of characters.
        Some((&self.text[start..self.at - 1], escaped))
    }

    /// A string written without escapes.
    fn plain_string(&mut self) -> Option<&'a str> {
        match self.string()? {
            (text, false) => Some(text),
            (_, true) => None,
        }
    }

    /// An object of piece → id, its entries added to `pieces`.
    fn pieces(&mut self, pieces: &mut Reader) -> Option<()> {
        self.eat(b'{')?;
        if self.eat(b'}').is_some() {
            return Some(());
        }
        loop {
            match self.string()? {
                (piece, false) => {
                    self.eat(b':')?;
                    pieces.push(piece, self.id()?);
                }
                (written, true) => {
                    // Rare (a quote, a backslash, a control character, or text written as
                    // `\u` escapes): `serde_json` reads it, quotes included.
                    let quoted = &self.text[self.at - written.len() - 2..self.at];
                    let piece: String = serde_json::from_str(quoted).ok()?;
                    self.eat(b':')?;
                    pieces.push(&piece, self.id()?);
                }
            }
            if self.eat(b',').is_none() {
                return self.eat(b'}');
            }
        }
    }

    /// An id: an integer of `u32`, written without sign, fraction or exponent.
    fn id(&mut self) -> Option<u32> {
        self.peek()?;
        let bytes = self.text.as_bytes();
        let start = self.at;
        let mut id: u32 = 0;
        while let Some(&digit @ b'0'..=b'9') = bytes.get(self.at) {
            id = id.checked_mul(10)?.checked_add(u32::from(digit - b'0'))?;
            self.at += 1;
        }
        let ends = matches!(bytes.get(self.at), Some(b',' | b'}' | b' ' | b'\t' | b'\n' | b'\r'));
        (self.at > start && ends).then_some(id)
    }

    /// Skips a value of any kind.
    fn skip_value(&mut self) -> Option<()> {
        self.peek()?;
        let bytes = self.text.as_bytes();
        let mut depth = 0usize;
        loop {
            match *bytes.get(self.at)? {
                b'"' => {
                    self.string()?;
                    if depth == 0 {
                        return Some(());
                    }
                    continue;
                }
                b'{' | b'[' => depth += 1,
                b'}' | b']' if depth == 0 => return Some(()),
                b'}' | b']' => {
                    depth -= 1;
                    if depth == 0 {
                        self.at += 1;
                        return Some(());
                    }
                }
                b',' if depth == 0 => return Some(()),
                _ => {}
            }
            self.at += 1;
        }
    }
}

/// A model's vocabulary as pieces by id: a model that only answers what decoding and the added
/// vocabulary ask (`id_to_token`; `token_to_id` of the added tokens' contents; the vocabulary's
/// size), so that no map of the whole vocabulary is built.
pub(crate) struct Pieces {
    /// The pieces' text, one after another.
    text: String,
    /// The pieces of the ids below the vocabulary's dense range's end: twice its entries, and
    /// 1024 more.
    by_id: Vec<Option<Span>>,
    /// Pieces of ids far past the others (a hand-edited file), kept apart so that a huge id
    /// costs no huge table: it then fails the crate's check against its embedding rows.
    far: HashMap<u32, Span>,
    /// Entries of the vocabulary (`get_vocab_size`, as the model counts them).
    entries: usize,
    largest: Option<u32>,
    /// The ids of the added tokens' contents that the vocabulary holds.
    ids_of_added: HashMap<String, u32>,
}

/// Where a piece lies in [`Pieces::text`].
#[derive(Clone, Copy)]
struct Span {
    start: u32,
    end: u32,
}

impl Pieces {
    /// The vocabulary of the model object `model` (JSON that `serde_json` has checked) in its
    /// usual form, read without a string allocated per piece: a `type` of the four and a
    /// `vocab` of piece → id. `added` are the added tokens' contents, sorted. Returns `None`
    /// for anything else (no `vocab`, a list, an id not written as a plain integer of `u32`, a
    /// `type` or a key written with escapes or given twice), which [`Pieces::read`] then reads
    /// or refuses with its reason. A stories15M vocabulary (32000 pieces, 714 KB) takes 1.6 ms
    /// here against 6.1 there (on an AMD EPYC, Zen 3).
    pub(crate) fn scan(model: &str, added: &[&str]) -> Option<Pieces> {
        let mut json = Scanner { text: model, at: 0 };
        let mut pieces = Reader::new(model, added);
        let (mut name, mut vocab) = (None, false);
        json.eat(b'{')?;
        if json.eat(b'}').is_none() {
            loop {
                let key = json.plain_string()?;
                json.eat(b':')?;
                match key {
                    "type" if name.is_none() => name = Some(json.plain_string()?),
                    "vocab" if !vocab => {
                        json.pieces(&mut pieces)?;
                        vocab = true;
                    }
                    "type" | "vocab" => return None,
                    _ => json.skip_value()?,
                }
                if json.eat(b',').is_none() {
                    json.eat(b'}')?;
                    break;
                }
            }
        }
        let known = name.is_none_or(|name| ["BPE", "WordPiece", "WordLevel", "Unigram"].contains(&name));
        (known && vocab).then(|| pieces.finish())
    }

    /// The vocabulary of the model object `model`, read by `serde_json`: any form the model's
    /// reader takes (Unigram's list among them), and the reasons for one it refuses.
    fn read(model: &str, added: &[&str]) -> Result<Pieces, tokenizers::Error> {
        let mut pieces = Reader::new(model, added);
        for (piece, id) in serde_json::from_str::<PiecesOf>(model)?.entries()? {
            pieces.push(&piece, id);
        }
        Ok(pieces.finish())
    }

    fn piece(&self, span: Span) -> &str {
        &self.text[span.start as usize..span.end as usize]
    }
}

/// [`Pieces`] as a vocabulary's entries come, in file order.
struct Reader<'a> {
    pieces: Pieces,
    /// The added tokens' contents, sorted.
    added: &'a [&'a str],
    /// Whether a content of `added` starts with each byte (or, at 256, is empty): most pieces
    /// are no content, and this tells most of them without a search.
    starts: [bool; 257],
    /// Ids from here on go to `far` at once. A model of `n` bytes holds at most n / 4
    /// entries (`"":0` is the shortest), so the dense range ends before.
    limit: usize,
}

impl<'a> Reader<'a> {
    /// A reader of the vocabulary of `model`, the JSON text of the model object.
    fn new(model: &str, added: &'a [&'a str]) -> Reader<'a> {
        let mut starts = [false; 257];
        for content in added {
            starts[content.as_bytes().first().map_or(256, |&b| usize::from(b))] = true;
        }
        // The pieces' text is no longer than the model's.
        let pieces = Pieces {
            text: String::with_capacity(model.len()),
            by_id: Vec::new(),
            far: HashMap::new(),
            entries: 0,
            largest: None,
            ids_of_added: HashMap::new(),
        };
        Reader { pieces, added, starts, limit: 2 * (model.len() / 4) + 1024 }
    }

    /// Adds the entry of `piece` and `id`. The last entry of an id gives its piece, and the
    /// last of a piece among the added tokens' contents gives that content's id.
    fn push(&mut self, piece: &str, id: u32) {
        let pieces = &mut self.pieces;
        // `read` has checked that the file, whose text holds every piece, has bounds in `u32`.
        let start = pieces.text.len() as u32;
        pieces.text.push_str(piece);
        let span = Span { start, end: pieces.text.len() as u32 };
        pieces.entries += 1;
        pieces.largest = pieces.largest.max(Some(id));
        if self.starts[piece.as_bytes().first().map_or(256, |&b| usize::from(b))]
            && self.added.binary_search(&piece).is_ok()
        {
            pieces.ids_of_added.insert(piece.to_string(), id);
        }
        let index = id as usize;
        if index >= self.limit {
            pieces.far.insert(id, span);
            return;
        }
        if index >= pieces.by_id.len() {
            pieces.by_id.resize(index + 1, None);
        }
        pieces.by_id[index] = Some(span);
    }

    /// The pieces, those past the dense range's end (now that the entries are counted) moved
    /// apart.
    fn finish(self) -> Pieces {
        let mut pieces = self.pieces;
        let dense = 2 * pieces.entries + 1024;
        if pieces.by_id.len() > dense {
            for (id, span) in pieces.by_id.drain(dense..).enumerate() {
                if let Some(span) = span {
                    pieces.far.insert((dense + id) as u32, span);
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
        let span = match self.by_id.get(id as usize) {
            Some(span) => *span,
            None => self.far.get(&id).copied(),
        };
        Some(self.piece(span?).to_string())
    }

    fn get_vocab(&self) -> HashMap<String, u32> {
        let table = self.by_id.iter().enumerate().filter_map(|(id, span)| Some((id as u32, (*span)?)));
        let pieces = table.chain(self.far.iter().map(|(&id, &span)| (id, span)));
        pieces.map(|(id, span)| (self.piece(span).to_string(), id)).collect()
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
