//! Rust source in, formatted Rust source out, with the plain `//` comments kept.
//!
//! syn drops plain comments, and prettyplease prints only what syn keeps. To keep the shape
//! comments of the forward pass and the comments of kernel sources, a comment that stands
//! on its own line where a statement or an item may stand is turned into a marker macro,
//! `__monogen_comment!("text");`, before parsing; after prettyplease has printed the file,
//! every marker line is turned back into `// text`. The emitters write the same marker with
//! [`comment`].
//!
//! Comments that cannot be kept this way (after code on the same line, inside an
//! expression, between match arms or struct fields, block comments) are rejected with
//! their line number instead of being dropped silently.

use std::collections::{BTreeMap, BTreeSet};

use proc_macro2::TokenStream;
use quote::quote;

const MARKER: &str = "__monogen_comment";
const BLANK: &str = "__monogen_blank";

/// A `// text` comment as a statement or item, for `quote!` emitters.
pub fn comment(text: &str) -> TokenStream {
    quote! { __monogen_comment!(#text); }
}

/// A string literal of `text` that reads as the text: a raw string (`r#"…"#`, with as many
/// `#` as the text needs) where it has lines or quotes, an ordinary one otherwise or where a
/// raw string cannot hold it (a carriage return).
pub fn string_literal(text: &str) -> proc_macro2::Literal {
    if !text.contains(['\n', '"', '\\']) || text.contains('\r') {
        return proc_macro2::Literal::string(text);
    }
    let hashes =
        (1..).map(|n| "#".repeat(n)).find(|h| !text.contains(&format!("\"{h}"))).expect("some count is free");
    format!("r{hashes}\"{text}\"{hashes}").parse().expect("a raw string literal")
}

/// A problem that keeps a source from being re-printed faithfully.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceError {
    /// 1-based line, 1-based column.
    pub line: usize,
    pub column: usize,
    pub message: String,
}

/// Lexer state at the start of a character.
#[derive(Clone, Copy, PartialEq)]
enum State {
    Code,
    Str,
    RawStr(usize),
}

/// Turns own-line `//` comments into markers; rejects comments that would be lost.
pub fn encode_comments(source: &str) -> Result<String, SourceError> {
    encode(source, false)
}

/// As [`encode_comments`], and blank lines between statements or items become markers too.
fn encode(source: &str, keep_blank_lines: bool) -> Result<String, SourceError> {
    let mut out = String::with_capacity(source.len() + source.len() / 4);
    let mut state = State::Code;
    for (index, line) in source.split_inclusive('\n').enumerate() {
        let line_no = index + 1;
        let body = line.trim_end_matches(['\n', '\r']);
        let trimmed = body.trim_start();
        if state == State::Code && trimmed.starts_with("//") && !is_doc(trimmed) {
            let indent = &body[..body.len() - trimmed.len()];
            let text = trimmed[2..].strip_prefix(' ').unwrap_or(&trimmed[2..]);
            out.push_str(&format!("{indent}{MARKER}!({text:?});\n"));
            continue;
        }
        if keep_blank_lines && state == State::Code && trimmed.is_empty() {
            out.push_str(&format!("{BLANK}!();\n"));
            continue;
        }
        state = scan_line(body, state, line_no)?;
        out.push_str(line);
    }
    Ok(out)
}

fn is_doc(trimmed: &str) -> bool {
    (trimmed.starts_with("///") && !trimmed.starts_with("////")) || trimmed.starts_with("//!")
}

/// Scans one line of code, returning the state at its end; errors on comments after code.
fn scan_line(line: &str, mut state: State, line_no: usize) -> Result<State, SourceError> {
    let bytes = line.as_bytes();
    let mut i = 0;
    let err = |i: usize, message: &str| SourceError {
        line: line_no,
        column: line[..i].chars().count() + 1,
        message: message.into(),
    };
    while i < bytes.len() {
        match state {
            State::Code => match bytes[i] {
                b'/' if bytes.get(i + 1) == Some(&b'/') => {
                    let rest = &line[i..];
                    if is_doc(rest) && line[..i].trim().is_empty() {
                        return Ok(State::Code);
                    }
                    return Err(err(
                        i,
                        "comment after code on the same line would be lost; put it on its own line above the code",
                    ));
                }
                b'/' if bytes.get(i + 1) == Some(&b'*') => {
                    return Err(err(
                        i,
                        "block comments (/* */) would be lost; use // comments on their own lines",
                    ));
                }
                b'"' => {
                    state = State::Str;
                    i += 1;
                }
                b'r' if starts_raw_string(&bytes[i..]).is_some()
                    && (i == 0 || !is_ident_byte(bytes[i - 1])) =>
                {
                    let (hashes, len) = starts_raw_string(&bytes[i..]).unwrap();
                    state = State::RawStr(hashes);
                    i += len;
                }
                b'\'' => i += char_literal_len(&bytes[i..]),
                _ => i += 1,
            },
            State::Str => match bytes[i] {
                b'\\' => i += 2,
                b'"' => {
                    state = State::Code;
                    i += 1;
                }
                _ => i += 1,
            },
            State::RawStr(hashes) => {
                if bytes[i] == b'"'
                    && bytes[i + 1..].iter().take(hashes).filter(|&&b| b == b'#').count() == hashes
                {
                    state = State::Code;
                    i += 1 + hashes;
                } else {
                    i += 1;
                }
            }
        }
    }
    Ok(state)
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// `r"`, `r#"`, ... → (number of hashes, length of the opener).
fn starts_raw_string(bytes: &[u8]) -> Option<(usize, usize)> {
    let hashes = bytes[1..].iter().take_while(|&&b| b == b'#').count();
    (bytes.get(1 + hashes) == Some(&b'"')).then_some((hashes, 2 + hashes))
}

/// Length of a char literal starting at `'`, or 1 for a lifetime's quote.
fn char_literal_len(bytes: &[u8]) -> usize {
    if bytes.get(1) == Some(&b'\\') {
        let close = bytes[2..].iter().position(|&b| b == b'\'').map_or(bytes.len(), |p| p + 3);
        return close.min(bytes.len());
    }
    let ch_len = std::str::from_utf8(&bytes[1..bytes.len().min(5)])
        .ok()
        .or_else(|| (1..5).rev().find_map(|n| std::str::from_utf8(&bytes[1..bytes.len().min(1 + n)]).ok()))
        .and_then(|s| s.chars().next())
        .map_or(1, char::len_utf8);
    if bytes.get(1 + ch_len) == Some(&b'\'') { 2 + ch_len } else { 1 }
}

/// Parses a Rust source with its comments encoded as markers, and its blank lines too where
/// they all stand between statements or items (otherwise prettyplease's spacing is used).
pub fn parse_with_comments(source: &str) -> Result<syn::File, SourceError> {
    if let Ok(file) = syn::parse_file(&encode(source, true)?)
        && misplaced_marker(&file).is_none()
    {
        return Ok(file);
    }
    let encoded = encode_comments(source)?;
    let file = syn::parse_file(&encoded).map_err(|e| {
        let start = e.span().start();
        let plain = syn::parse_file(source).is_ok();
        let message = if plain {
            "a comment stands where no statement or item can (inside an expression, between match arms, struct fields or arguments); move it before the enclosing statement, or use a /// doc comment".to_string()
        } else {
            format!("does not parse as Rust: {e}")
        };
        SourceError { line: start.line, column: start.column + 1, message }
    })?;
    match misplaced_marker(&file) {
        None => Ok(file),
        Some(start) => Err(SourceError {
            line: start.line,
            column: start.column + 1,
            message: "a comment stands inside an expression (after `=`, in a literal or an argument list), where it would be lost; move it before the statement".into(),
        }),
    }
}

/// The position of a marker macro that is not a whole statement or item: a comment that
/// landed inside an expression parses (as a macro call) but would not print as a comment.
fn misplaced_marker(file: &syn::File) -> Option<proc_macro2::LineColumn> {
    use syn::visit::Visit;
    struct Finder {
        placed: usize,
        misplaced: Option<proc_macro2::LineColumn>,
    }
    fn is_marker(mac: &syn::Macro) -> bool {
        mac.path.is_ident(MARKER) || mac.path.is_ident(BLANK)
    }
    impl Finder {
        /// Whether `mac` is a marker standing as a whole statement or item, counted if so.
        fn place(&mut self, mac: &syn::Macro) -> bool {
            let marker = is_marker(mac);
            self.placed += usize::from(marker);
            marker
        }
    }
    impl<'ast> Visit<'ast> for Finder {
        fn visit_stmt(&mut self, stmt: &'ast syn::Stmt) {
            if !matches!(stmt, syn::Stmt::Macro(m) if self.place(&m.mac)) {
                syn::visit::visit_stmt(self, stmt);
            }
        }
        fn visit_item(&mut self, item: &'ast syn::Item) {
            if !matches!(item, syn::Item::Macro(m) if self.place(&m.mac)) {
                syn::visit::visit_item(self, item);
            }
        }
        fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
            if !matches!(item, syn::ImplItem::Macro(m) if self.place(&m.mac)) {
                syn::visit::visit_impl_item(self, item);
            }
        }
        fn visit_macro(&mut self, mac: &'ast syn::Macro) {
            if is_marker(mac) && self.misplaced.is_none() {
                self.misplaced = Some(mac.path.segments[0].ident.span().start());
            }
        }
    }
    let mut finder = Finder { placed: 0, misplaced: None };
    finder.visit_file(file);
    finder.misplaced
}

/// Removes the methods named `names` from every inherent `impl` of `file`: a runtime file's
/// helpers that one architecture's crates never call are not generated for them.
pub fn remove_methods(file: &mut syn::File, names: &[&str]) {
    for item in &mut file.items {
        if let syn::Item::Impl(block) = item {
            let before = block.items.len();
            block
                .items
                .retain(|i| !matches!(i, syn::ImplItem::Fn(f) if names.iter().any(|n| f.sig.ident == n)));
            if block.items.len() == before {
                continue;
            }
            // The blank line that stood beside a removed method must not end up doubled, or
            // first or last in the block.
            let blank =
                |i: &syn::ImplItem| matches!(i, syn::ImplItem::Macro(m) if m.mac.path.is_ident(BLANK));
            let items = std::mem::take(&mut block.items);
            for item in items {
                if blank(&item) && block.items.last().is_none_or(blank) {
                    continue;
                }
                block.items.push(item);
            }
            if block.items.last().is_some_and(blank) {
                block.items.pop();
            }
        }
    }
}

/// Prints a file with prettyplease, with blank lines between items (prettyplease puts
/// none), and turns comment markers back into comments.
pub fn print(file: &syn::File) -> String {
    let mut file = file.clone();
    space_items(&mut file.items);
    decode_comments(&prettyplease::unparse(&file))
}

/// Whether an item is a `__monogen_comment!` marker.
fn is_comment_item(item: &syn::Item) -> bool {
    matches!(item, syn::Item::Macro(m) if m.mac.path.is_ident(MARKER))
}

/// Items of these kinds stay together without blank lines: `use` lists, `mod x;` lists.
fn group_of(item: &syn::Item) -> Option<&'static str> {
    match item {
        syn::Item::Use(_) => Some("use"),
        syn::Item::Mod(m) if m.content.is_none() => Some("mod"),
        syn::Item::ExternCrate(_) => Some("extern crate"),
        _ => None,
    }
}

/// Inserts blank-line markers between items, recursing into impls, traits and inline modules.
fn space_items(items: &mut Vec<syn::Item>) {
    let old = std::mem::take(items);
    for item in old {
        let mut item = item;
        match &mut item {
            syn::Item::Impl(imp) => space_impl_items(&mut imp.items),
            syn::Item::Mod(m) => {
                if let Some((_, content)) = &mut m.content {
                    space_items(content);
                }
            }
            _ => {}
        }
        if let Some(previous) = items.last() {
            let grouped = group_of(previous).is_some() && group_of(previous) == group_of(&item);
            if !grouped && !is_comment_item(previous) {
                items.push(syn::parse_quote!(__monogen_blank!();));
            }
        }
        items.push(item);
    }
}

fn space_impl_items(items: &mut Vec<syn::ImplItem>) {
    let old = std::mem::take(items);
    for item in old {
        if let Some(previous) = items.last() {
            let after_comment = matches!(previous, syn::ImplItem::Macro(m) if m.mac.path.is_ident(MARKER));
            if !after_comment {
                items.push(syn::parse_quote!(__monogen_blank!();));
            }
        }
        items.push(item);
    }
}

/// Prints tokens as a whole file (see [`print`]).
pub fn print_tokens(tokens: TokenStream) -> String {
    let file: syn::File = syn::parse2(tokens.clone())
        .unwrap_or_else(|e| panic!("emitter produced tokens that are not a Rust file: {e}\n{tokens}"));
    print(&file)
}

/// Marker lines back to `// text` (or to blank lines), with a blank line before a comment
/// that follows code and after the module's inner doc comment.
pub fn decode_comments(printed: &str) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut lines = printed.lines();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        if trimmed.starts_with(BLANK) {
            if out.last().is_some_and(|l| !l.is_empty()) {
                out.push(String::new());
            }
            continue;
        }
        if let Some(rest) = trimmed.strip_prefix(MARKER).and_then(|r| r.strip_prefix("!(")) {
            // prettyplease breaks a long marker over several lines: gather it.
            let mut call = rest.to_string();
            while !call.trim_end().ends_with(");") {
                match lines.next() {
                    Some(next) => call.push_str(next.trim()),
                    None => break,
                }
            }
            let text = call
                .trim_end()
                .strip_suffix(");")
                .and_then(|lit| syn::parse_str::<syn::LitStr>(lit.trim().trim_end_matches(',')).ok())
                .map(|lit| lit.value());
            if let Some(text) = text {
                let previous = out.last().map(|l| l.trim()).unwrap_or("");
                let after_code = !(previous.is_empty()
                    || previous.ends_with('{')
                    || previous.starts_with("//")
                    || previous.starts_with("#["));
                if after_code {
                    out.push(String::new());
                }
                out.push(if text.is_empty() { format!("{indent}//") } else { format!("{indent}// {text}") });
                continue;
            }
        }
        let previous_is_inner_doc = out.last().is_some_and(|l| l.starts_with("//!"));
        if previous_is_inner_doc && !trimmed.starts_with("//!") && !trimmed.is_empty() {
            out.push(String::new());
        }
        out.push(line.to_string());
    }
    let mut text = join_turbofish(&out).join("\n");
    text.push('\n');
    text
}

/// prettyplease breaks a long call's turbofish one generic argument a line
/// (`f::<\n A,\n B,\n>(x)`); put the arguments back on the call's line when it fits.
fn join_turbofish(lines: &[String]) -> Vec<String> {
    const WIDTH: usize = 100;
    let mut out = Vec::with_capacity(lines.len());
    let mut i = 0;
    while i < lines.len() {
        let line = &lines[i];
        if line.ends_with("::<") {
            let args: Vec<&str> =
                lines[i + 1..].iter().map(|l| l.trim()).take_while(|l| !l.starts_with('>')).collect();
            let close = lines.get(i + 1 + args.len()).map(|l| l.trim());
            if let Some(close) = close.filter(|_| args.iter().all(|a| a.ends_with(',') && !a.contains('('))) {
                let generics = args.iter().map(|a| a.trim_end_matches(',')).collect::<Vec<_>>().join(", ");
                let joined = format!("{line}{generics}{close}");
                if joined.len() <= WIDTH {
                    out.push(joined);
                    i += args.len() + 2;
                    continue;
                }
                // Too long on one line: generics on the call's line, one argument a line.
                let inner = close.strip_prefix(">(").and_then(|c| c.strip_suffix(");"));
                if let Some(inner) =
                    inner.filter(|a| !a.is_empty() && !a.contains(['(', '[', '{', '"', '\'']))
                {
                    let indent = &line[..line.len() - line.trim_start().len()];
                    out.push(format!("{line}{generics}>("));
                    out.extend(inner.split(", ").map(|a| format!("{indent}    {a},")));
                    out.push(format!("{indent});"));
                    i += args.len() + 2;
                    continue;
                }
            }
        }
        out.push(line.clone());
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(src: &str) -> String {
        print(&parse_with_comments(src).unwrap())
    }

    #[test]
    fn remove_methods_drops_only_the_named_methods_of_inherent_impls() {
        let src = "struct T;\n\nimpl T {\n    /// kept\n    fn keep(&self) {}\n\n    /// dropped\n    fn drop_me(&self) {}\n}\n\nfn drop_me() {}\n";
        let mut file = parse_with_comments(src).unwrap();
        remove_methods(&mut file, &["drop_me"]);
        let out = print(&file);
        assert!(out.contains("fn keep(&self)") && out.contains("/// kept"), "{out}");
        assert!(!out.contains("fn drop_me(&self)") && !out.contains("dropped"), "{out}");
        assert!(out.contains("fn drop_me() {}"), "a free function of that name stays: {out}");
        assert!(!out.contains("{}\n\n}"), "no blank line is left at the end of the block: {out}");
    }

    #[test]
    fn keeps_own_line_comments_at_items_and_statements() {
        let src = "// about f\nfn f() -> u32 {\n    let a = 1;\n    // the answer: \"42\"\n    a + 41\n}\n";
        let out = round_trip(src);
        assert_eq!(
            out,
            "// about f\nfn f() -> u32 {\n    let a = 1;\n\n    // the answer: \"42\"\n    a + 41\n}\n"
        );
        let long = "x".repeat(120);
        let out = round_trip(&format!("fn f() {{\n    let a = 1;\n    // {long}\n    let b = a;\n}}\n"));
        assert!(out.contains(&format!("    // {long}\n    let b = a;")), "{out}");
    }

    #[test]
    fn keeps_doc_comments_and_strings_with_slashes() {
        let src = "//! module\n/// doc\npub fn f() -> &'static str {\n    \"http://x\"\n}\n";
        let out = round_trip(src);
        assert!(
            out.contains("//! module") && out.contains("/// doc") && out.contains("\"http://x\""),
            "{out}"
        );
    }

    #[test]
    fn rejects_comments_that_would_be_lost() {
        let e = parse_with_comments("fn f() {\n    let a = 1; // trailing\n}\n").unwrap_err();
        assert_eq!((e.line, e.column), (2, 16));
        let e = parse_with_comments("fn f() {}\n/* block */\n").unwrap_err();
        assert_eq!(e.line, 2);
        let e = parse_with_comments("fn f(x: u8) -> u8 {\n    match x {\n        // zero\n        0 => 1,\n        _ => 2,\n    }\n}\n").unwrap_err();
        assert_eq!(e.line, 3, "{e:?}");
        assert!(e.message.contains("comment stands where"), "{e:?}");
    }

    #[test]
    fn items_are_separated_by_blank_lines_and_uses_grouped() {
        let src = "//! doc\nuse a::b;\nuse c::d;\nmod m;\nmod n;\n// about S\nstruct S;\nimpl S {\n    fn a() {}\n    fn b() {}\n}\n";
        let out = round_trip(src);
        assert_eq!(
            out,
            "//! doc\n\nuse a::b;\nuse c::d;\n\nmod m;\nmod n;\n\n// about S\nstruct S;\n\nimpl S {\n    fn a() {}\n\n    fn b() {}\n}\n"
        );
    }

    #[test]
    fn broken_turbofish_calls_are_joined_when_they_fit() {
        let long = "a".repeat(90);
        let lines: Vec<String> = [
            "        f::<",
            "            A,",
            "            B,",
            "        >(x, y);",
            "        g::<",
            "            C,",
            "        >(",
            "            z,",
            "        );",
            "    h::<",
            "        D,",
            &format!("    >({long}, b);"),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            join_turbofish(&lines),
            [
                "        f::<A, B>(x, y);",
                "        g::<C>(",
                "            z,",
                "        );",
                "    h::<D>(",
                &format!("        {long},"),
                "        b,",
                "    );"
            ]
        );
    }

    #[test]
    fn blank_lines_between_statements_are_kept() {
        let src = "fn f() {\n    let a = 1;\n\n    let b = a;\n    let c = S {\n        x: 1,\n\n        y: 2,\n    };\n}\n";
        // The blank line inside the struct literal cannot be a marker: spacing falls back.
        assert_eq!(
            round_trip(src),
            "fn f() {\n    let a = 1;\n    let b = a;\n    let c = S { x: 1, y: 2 };\n}\n"
        );
        let src = "fn f() {\n    let a = 1;\n\n    let b = a;\n}\n";
        assert_eq!(round_trip(src), src);
    }

    #[test]
    fn comments_inside_expressions_are_rejected_not_mangled() {
        let e = parse_with_comments("fn f() {\n    let s =\n        // note\n        1.0;\n}\n").unwrap_err();
        assert_eq!(e.line, 3, "{e:?}");
        assert!(e.message.contains("inside an expression"), "{e:?}");
        let e = parse_with_comments("fn f() {\n    let a = [\n        // first\n        1.0,\n    ];\n}\n")
            .unwrap_err();
        assert!((3..=4).contains(&e.line) && e.message.contains("comment stands"), "{e:?}");
        // A blank line inside an expression only falls back to prettyplease's spacing.
        let out = round_trip("fn f() {\n    let s =\n\n        1.0;\n}\n");
        assert_eq!(out, "fn f() {\n    let s = 1.0;\n}\n");
    }

    #[test]
    fn lifetimes_and_char_literals_do_not_confuse_the_scanner() {
        let src = "fn f<'a>(x: &'a str) -> char {\n    let _ = '\"';\n    let _ = '\\'';\n    // still code\n    'x'\n}\n";
        assert!(round_trip(src).contains("// still code"));
    }

    #[test]
    fn emitter_comments_round_trip() {
        let body = comment("x: [T, DIM]");
        let out = print_tokens(quote! { fn f() { let a = 1; #body let b = a; } });
        assert!(out.contains("    let a = 1;\n\n    // x: [T, DIM]\n    let b = a;"), "{out}");
    }
}

/// The placeholder macro of a template file's slots.
pub const SLOT: &str = "__slot";

/// Fills the `__slot!(name)` placeholders of a template file (`templates/llama/model.rs`): a
/// slot that stands as an item or a statement becomes the items or statements of
/// `slots[name]` (none for empty tokens), one that stands as an expression its expression.
/// Every slot of the file must be given and every slot given must be used; the error names
/// the slot.
pub fn fill_slots(file: &mut syn::File, slots: &BTreeMap<&str, TokenStream>) -> Result<(), String> {
    use syn::visit_mut::VisitMut;
    struct Filler<'a> {
        slots: &'a BTreeMap<&'a str, TokenStream>,
        used: BTreeSet<String>,
        error: Option<String>,
    }
    impl Filler<'_> {
        /// The tokens of slot `mac`, if it is one.
        fn tokens(&mut self, mac: &syn::Macro) -> Option<TokenStream> {
            if !mac.path.is_ident(SLOT) {
                return None;
            }
            let name = mac.tokens.to_string();
            match self.slots.get(name.as_str()) {
                Some(tokens) => {
                    self.used.insert(name);
                    Some(tokens.clone())
                }
                None => {
                    self.error.get_or_insert(format!(
                        "the template has slot `{name}`, which the emitter does not fill"
                    ));
                    Some(TokenStream::new())
                }
            }
        }
        fn fail(&mut self, name: &str, what: &str, e: syn::Error) {
            self.error.get_or_insert(format!("slot `{name}` is not {what}: {e}"));
        }
        fn items(&mut self, items: &mut Vec<syn::Item>) {
            for item in std::mem::take(items) {
                if let syn::Item::Macro(m) = &item
                    && let Some(tokens) = self.tokens(&m.mac)
                {
                    match syn::parse2::<syn::File>(tokens) {
                        Ok(file) => items.extend(file.items),
                        Err(e) => self.fail(&m.mac.tokens.to_string(), "items", e),
                    }
                    continue;
                }
                let mut item = item;
                self.visit_item_mut(&mut item);
                items.push(item);
            }
        }
    }
    impl VisitMut for Filler<'_> {
        fn visit_file_mut(&mut self, file: &mut syn::File) {
            self.items(&mut file.items);
        }
        fn visit_item_mod_mut(&mut self, module: &mut syn::ItemMod) {
            if let Some((_, items)) = &mut module.content {
                self.items(items);
            }
        }
        fn visit_item_impl_mut(&mut self, imp: &mut syn::ItemImpl) {
            for item in std::mem::take(&mut imp.items) {
                if let syn::ImplItem::Macro(m) = &item
                    && let Some(tokens) = self.tokens(&m.mac)
                {
                    match syn::parse2::<syn::ItemImpl>(quote::quote!(impl X { #tokens })) {
                        Ok(filled) => imp.items.extend(filled.items),
                        Err(e) => self.fail(&m.mac.tokens.to_string(), "associated items", e),
                    }
                    continue;
                }
                let mut item = item;
                self.visit_impl_item_mut(&mut item);
                imp.items.push(item);
            }
        }
        fn visit_block_mut(&mut self, block: &mut syn::Block) {
            for stmt in std::mem::take(&mut block.stmts) {
                if let syn::Stmt::Macro(m) = &stmt
                    && let Some(tokens) = self.tokens(&m.mac)
                {
                    match syn::parse2::<syn::Block>(quote::quote!({ #tokens })) {
                        Ok(filled) => block.stmts.extend(filled.stmts),
                        Err(e) => self.fail(&m.mac.tokens.to_string(), "statements", e),
                    }
                    continue;
                }
                let mut stmt = stmt;
                self.visit_stmt_mut(&mut stmt);
                block.stmts.push(stmt);
            }
        }
        fn visit_expr_mut(&mut self, expr: &mut syn::Expr) {
            if let syn::Expr::Macro(m) = expr
                && let Some(tokens) = self.tokens(&m.mac)
            {
                match syn::parse2::<syn::Expr>(tokens) {
                    Ok(filled) => *expr = filled,
                    Err(e) => self.fail(&m.mac.tokens.to_string(), "an expression", e),
                }
                return;
            }
            syn::visit_mut::visit_expr_mut(self, expr);
        }
    }
    let mut filler = Filler { slots, used: BTreeSet::new(), error: None };
    filler.visit_file_mut(file);
    if let Some(e) = filler.error {
        return Err(e);
    }
    match slots.keys().find(|name| !filler.used.contains(**name)) {
        Some(unused) => Err(format!("the emitter fills slot `{unused}`, which the template does not have")),
        None => Ok(()),
    }
}

#[cfg(test)]
mod slot_tests {
    use super::*;

    fn filled(source: &str, slots: &[(&'static str, TokenStream)]) -> Result<String, String> {
        let mut file = parse_with_comments(source).map_err(|e| e.message)?;
        fill_slots(&mut file, &slots.iter().cloned().collect())?;
        Ok(print(&file))
    }

    #[test]
    fn slots_become_items_statements_and_expressions() {
        let source = "fn f(x: &mut [f32]) {\n    // scale x\n    __slot!(scale);\n    let n = __slot!(len);\n}\n\n__slot!(helpers);\n";
        let done = comment("done");
        let out = filled(
            source,
            &[
                ("scale", quote!(for v in x.iter_mut() { *v *= 2.0; } #done)),
                ("len", quote!(x.len())),
                (
                    "helpers",
                    quote!(
                        fn g() {}
                        fn h() {}
                    ),
                ),
            ],
        )
        .unwrap();
        assert!(out.contains("    // scale x\n    for v in x.iter_mut() {"), "{out}");
        assert!(out.contains("let n = x.len();"), "{out}");
        assert!(out.contains("fn g() {}") && out.contains("fn h() {}"), "{out}");
        // An empty slot leaves nothing behind.
        let out = filled(source, &[("scale", quote!()), ("len", quote!(0)), ("helpers", quote!())]).unwrap();
        assert!(!out.contains("__slot") && !out.contains("fn g"), "{out}");
    }

    #[test]
    fn a_slot_missing_or_left_over_is_named() {
        let source = "fn f() {\n    __slot!(a);\n}\n";
        let e = filled(source, &[]).unwrap_err();
        assert!(e.contains("slot `a`, which the emitter does not fill"), "{e}");
        let e = filled(source, &[("a", quote!()), ("b", quote!())]).unwrap_err();
        assert!(e.contains("fills slot `b`, which the template does not have"), "{e}");
        let e = filled(
            "fn f() {\n    let x = __slot!(a);\n}\n",
            &[(
                "a",
                quote!(
                    fn g() {}
                ),
            )],
        )
        .unwrap_err();
        assert!(e.contains("slot `a` is not an expression"), "{e}");
    }
}

/// The attribute that makes a template's item, statement, field, variant or match arm
/// conditional: `#[only_if(chat)]` keeps it where `chat` holds, `#[only_if(not(chat))]` where it
/// does not.
const ONLY_IF: &str = "only_if";

/// Keeps the `#[only_if(..)]` parts of a runtime file whose condition holds (and drops their
/// attribute), and removes the others along with the comments just above them: code paths that
/// do not apply to a crate are not generated. Every condition must be one of `features`; the
/// error names the one that is not.
pub fn select(file: &mut syn::File, features: &[(&str, bool)]) -> Result<(), String> {
    use syn::punctuated::Punctuated;
    use syn::visit_mut::VisitMut;

    struct Selector<'a> {
        features: &'a [(&'a str, bool)],
        error: Option<String>,
    }
    impl Selector<'_> {
        /// Whether the part with attributes `attrs` stays; its `only_if` attribute is removed.
        fn keep(&mut self, attrs: &mut Vec<syn::Attribute>) -> bool {
            let mut keep = true;
            let mut failed = None;
            attrs.retain(|attr| {
                if !attr.path().is_ident(ONLY_IF) {
                    return true;
                }
                let condition = match &attr.meta {
                    syn::Meta::List(list) => list.tokens.to_string().replace(' ', ""),
                    _ => String::new(),
                };
                let (name, negated) = match condition.strip_prefix("not(").and_then(|c| c.strip_suffix(')')) {
                    Some(name) => (name.to_string(), true),
                    None => (condition.clone(), false),
                };
                match self.features.iter().find(|(f, _)| *f == name) {
                    Some((_, holds)) => keep &= *holds != negated,
                    None => {
                        failed =
                            Some(format!("`#[only_if({condition})]` names no condition the emitter sets"))
                    }
                }
                false
            });
            if let Some(e) = failed {
                self.error.get_or_insert(e);
            }
            keep
        }

        /// The elements of `list` that stay, without a comment or blank line left above a
        /// removed one, or doubled.
        fn list<T>(
            &mut self,
            list: Vec<T>,
            mut attrs: impl FnMut(&mut T) -> Option<&mut Vec<syn::Attribute>>,
            marker: impl Fn(&T) -> Option<&syn::Macro>,
        ) -> Vec<T> {
            let is = |item: &T, name: &str| marker(item).is_some_and(|m| m.path.is_ident(name));
            let mut out: Vec<T> = Vec::with_capacity(list.len());
            for mut item in list {
                if attrs(&mut item).is_none_or(|a| self.keep(a)) {
                    out.push(item);
                    continue;
                }
                while out.last().is_some_and(|last| is(last, MARKER)) {
                    out.pop();
                }
            }
            let mut kept: Vec<T> = Vec::with_capacity(out.len());
            for item in out {
                if is(&item, BLANK) && kept.last().is_none_or(|last| is(last, BLANK)) {
                    continue;
                }
                kept.push(item);
            }
            if kept.last().is_some_and(|last| is(last, BLANK)) {
                kept.pop();
            }
            kept
        }

        fn items(&mut self, items: &mut Vec<syn::Item>) {
            *items = self.list(std::mem::take(items), item_attrs, |i| match i {
                syn::Item::Macro(m) => Some(&m.mac),
                _ => None,
            });
        }

        fn punctuated<T, P: Default>(
            &mut self,
            list: &mut Punctuated<T, P>,
            attrs: impl Fn(&mut T) -> &mut Vec<syn::Attribute>,
        ) {
            *list = std::mem::take(list)
                .into_iter()
                .filter_map(|mut t| self.keep(attrs(&mut t)).then_some(t))
                .collect();
        }
    }
    fn item_attrs(item: &mut syn::Item) -> Option<&mut Vec<syn::Attribute>> {
        use syn::Item::*;
        Some(match item {
            Const(i) => &mut i.attrs,
            Enum(i) => &mut i.attrs,
            Fn(i) => &mut i.attrs,
            Impl(i) => &mut i.attrs,
            Mod(i) => &mut i.attrs,
            Static(i) => &mut i.attrs,
            Struct(i) => &mut i.attrs,
            Trait(i) => &mut i.attrs,
            Type(i) => &mut i.attrs,
            Use(i) => &mut i.attrs,
            Macro(i) => &mut i.attrs,
            _ => return None,
        })
    }
    fn expr_attrs(expr: &mut syn::Expr) -> Option<&mut Vec<syn::Attribute>> {
        use syn::Expr::*;
        Some(match expr {
            Assign(e) => &mut e.attrs,
            Block(e) => &mut e.attrs,
            Call(e) => &mut e.attrs,
            ForLoop(e) => &mut e.attrs,
            If(e) => &mut e.attrs,
            Macro(e) => &mut e.attrs,
            Match(e) => &mut e.attrs,
            MethodCall(e) => &mut e.attrs,
            Return(e) => &mut e.attrs,
            _ => return None,
        })
    }
    impl VisitMut for Selector<'_> {
        fn visit_file_mut(&mut self, file: &mut syn::File) {
            self.items(&mut file.items);
            syn::visit_mut::visit_file_mut(self, file);
        }
        fn visit_item_mod_mut(&mut self, module: &mut syn::ItemMod) {
            if let Some((_, items)) = &mut module.content {
                self.items(items);
            }
            syn::visit_mut::visit_item_mod_mut(self, module);
        }
        fn visit_item_impl_mut(&mut self, imp: &mut syn::ItemImpl) {
            let items = std::mem::take(&mut imp.items);
            imp.items = self.list(
                items,
                |i| match i {
                    syn::ImplItem::Fn(f) => Some(&mut f.attrs),
                    syn::ImplItem::Const(c) => Some(&mut c.attrs),
                    syn::ImplItem::Type(t) => Some(&mut t.attrs),
                    _ => None,
                },
                |i| match i {
                    syn::ImplItem::Macro(m) => Some(&m.mac),
                    _ => None,
                },
            );
            syn::visit_mut::visit_item_impl_mut(self, imp);
        }
        fn visit_block_mut(&mut self, block: &mut syn::Block) {
            let stmts = std::mem::take(&mut block.stmts);
            block.stmts = self.list(
                stmts,
                |s| match s {
                    syn::Stmt::Local(l) => Some(&mut l.attrs),
                    syn::Stmt::Item(i) => item_attrs(i),
                    syn::Stmt::Expr(e, _) => expr_attrs(e),
                    syn::Stmt::Macro(m) => Some(&mut m.attrs),
                },
                |s| match s {
                    syn::Stmt::Macro(m) => Some(&m.mac),
                    _ => None,
                },
            );
            syn::visit_mut::visit_block_mut(self, block);
        }
        fn visit_fields_named_mut(&mut self, fields: &mut syn::FieldsNamed) {
            self.punctuated(&mut fields.named, |f| &mut f.attrs);
            syn::visit_mut::visit_fields_named_mut(self, fields);
        }
        fn visit_item_enum_mut(&mut self, item: &mut syn::ItemEnum) {
            self.punctuated(&mut item.variants, |v| &mut v.attrs);
            syn::visit_mut::visit_item_enum_mut(self, item);
        }
        fn visit_expr_match_mut(&mut self, expr: &mut syn::ExprMatch) {
            let arms = std::mem::take(&mut expr.arms);
            expr.arms =
                arms.into_iter().filter_map(|mut arm| self.keep(&mut arm.attrs).then_some(arm)).collect();
            syn::visit_mut::visit_expr_match_mut(self, expr);
        }
        fn visit_expr_struct_mut(&mut self, expr: &mut syn::ExprStruct) {
            self.punctuated(&mut expr.fields, |f| &mut f.attrs);
            syn::visit_mut::visit_expr_struct_mut(self, expr);
        }
    }

    let mut selector = Selector { features, error: None };
    selector.visit_file_mut(file);
    match selector.error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod select_tests {
    use super::*;

    fn selected(source: &str, chat: bool) -> Result<String, String> {
        let mut file = parse_with_comments(source).map_err(|e| e.message)?;
        select(&mut file, &[("chat", chat)])?;
        Ok(print(&file))
    }

    const SOURCE: &str = "use a::b;\n#[only_if(chat)]\nuse c::Chat;\n\nstruct S {\n    a: u8,\n    #[only_if(chat)]\n    chat: Chat,\n}\n\nenum E {\n    Plain,\n    #[only_if(chat)]\n    Chat,\n}\n\nfn f(e: E) -> u8 {\n    let x = 1;\n    // only for chat\n    #[only_if(chat)]\n    let x = x + 1;\n    #[only_if(not(chat))]\n    g();\n    let s = S {\n        a: x,\n        #[only_if(chat)]\n        chat: Chat,\n    };\n    match e {\n        E::Plain => 0,\n        #[only_if(chat)]\n        E::Chat => s.a,\n    }\n}\n\n/// Chat only.\n#[only_if(chat)]\nfn h() {}\n";

    #[test]
    fn parts_whose_condition_fails_are_removed_with_their_comments() {
        let plain = selected(SOURCE, false).unwrap();
        assert!(!plain.contains("only_if") && !plain.contains("Chat") && !plain.contains("chat"), "{plain}");
        assert!(plain.contains("g();") && plain.contains("E::Plain => 0"), "{plain}");
        let chat = selected(SOURCE, true).unwrap();
        assert!(!chat.contains("only_if") && !chat.contains("g();"), "{chat}");
        for part in [
            "use c::Chat;",
            "chat: Chat,",
            "// only for chat",
            "let x = x + 1;",
            "E::Chat => s.a",
            "/// Chat only.\nfn h() {}",
        ] {
            assert!(chat.contains(part), "{part} missing from:\n{chat}");
        }
    }

    #[test]
    fn an_unknown_condition_is_an_error() {
        let e = selected("#[only_if(chatty)]\nfn f() {}\n", true).unwrap_err();
        assert!(e.contains("only_if(chatty)"), "{e}");
    }
}

#[cfg(test)]
mod string_literal_tests {
    use super::string_literal;

    /// Every text comes back as the value of its literal, through the printer; a text with
    /// lines reads as itself (a raw string), with enough `#` for the quotes it holds.
    #[test]
    fn a_literal_holds_its_text_and_reads_as_it() {
        for text in
            ["plain", "two\nlines", "a \"quote\"", "\"# and \"## inside\n", "back\\slash", "cr\r\nlf", ""]
        {
            let literal = string_literal(text);
            let file = super::print_tokens(quote::quote!(const T: &str = #literal;));
            let parsed: syn::ItemConst = syn::parse_str(file.trim()).unwrap();
            let syn::Expr::Lit(syn::ExprLit { lit: syn::Lit::Str(value), .. }) = *parsed.expr else {
                panic!("{file}")
            };
            assert_eq!(value.value(), text, "{file}");
            if text.contains('\n') && !text.contains('\r') {
                assert!(file.contains(text), "not as it reads: {file}");
            }
        }
        assert!(string_literal("\"# and \"## inside\n").to_string().starts_with("r###\""));
    }
}
