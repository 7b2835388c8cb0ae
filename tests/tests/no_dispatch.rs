//! Every committed generated Rust file is free of runtime dispatch: no `dyn`, no function
//! pointer types, no `match`, `if`, `if let` or `matches!` over architectures, dtypes, devices,
//! types or CPU features, no CPU feature detection outside the start-up check, and nothing that
//! reads config.json.

use std::path::{Path, PathBuf};

use monogen_tests::workspace_root;
use quote::ToTokens;
use syn::visit::Visit;

/// Names whose appearance in a `match` means dispatch over what should be resolved already.
const RESOLVED_NAMES: &[&str] = &[
    "arch",
    "architecture",
    "dtype",
    "device",
    "llama",
    "bert",
    "f32",
    "bf16",
    "f16",
    "int8",
    "int4",
    "cpu",
    "cuda",
    "avx2",
    "avx512",
    "neon",
    "x86_64",
    "aarch64",
];

struct Finder<'a> {
    file: &'a Path,
    problems: Vec<String>,
}

impl Finder<'_> {
    fn report(&mut self, span: proc_macro2::Span, what: &str) {
        let line = span.start().line;
        self.problems.push(format!("{}:{line}: {what}", self.file.display()));
    }
}

/// Resolved names beyond [`RESOLVED_NAMES`] that a condition (`if`, `if let`, `matches!`,
/// `cfg!`) may not test through a constant or an enum variant.
const MORE_CONDITION_NAMES: &[&str] = &["q8", "amx"];

fn condition_name(word: &str) -> bool {
    RESOLVED_NAMES.contains(&word) || MORE_CONDITION_NAMES.contains(&word)
}

/// Why a condition dispatches over what the workload resolved, if it does: it tests a constant
/// named after a resolved name (`DTYPE`, `KV_DTYPE`, `HAS_AVX512`), an enum variant named after
/// one (`Weights::Int8`, `Device::Cuda`), which type a generic is (`TypeId`, `type_name`), or a
/// target feature. A loader's test of what a file holds (a runtime value, `dtype == Dtype::F32`
/// of safetensors' `Dtype`) is not dispatch: it reads its input. (A shared kernel's
/// `size_of::<W>() == 2`, folded for each element type it is compiled for, is not caught.)
fn dispatches(tokens: proc_macro2::TokenStream) -> Option<String> {
    let mut flat = Vec::new();
    flatten(tokens, &mut flat);
    let resolved = |ident: &str| {
        let lower = ident.to_lowercase();
        condition_name(&lower) || lower.split('_').any(condition_name)
    };
    for (i, token) in flat.iter().enumerate() {
        let in_path = i >= 1 && flat[i - 1] == "::";
        let is_const =
            token.chars().any(|c| c.is_ascii_uppercase()) && !token.chars().any(|c| c.is_ascii_lowercase());
        // `DTYPE`, `KV_DTYPE`, `DEVICE`, `TARGET_ARCH`, `BF16`, `HAS_AVX512`: not `AMX_ROWS`, a size.
        let names_a_choice = |name: &str| {
            let lower = name.to_lowercase();
            let parts: Vec<&str> = lower.split('_').collect();
            condition_name(&lower)
                || parts
                    .iter()
                    .any(|p| ["dtype", "device", "arch", "architecture", "feature", "features"].contains(p))
                || (parts.len() > 1
                    && ["has", "use", "is", "with"].contains(&parts[0])
                    && parts[1..].iter().all(|p| condition_name(p)))
        };
        if is_const && !in_path && names_a_choice(token) {
            return Some(format!("the constant `{token}`"));
        }
        if ["TypeId", "type_name", "target_feature"].contains(&token.as_str()) {
            return Some(format!("`{token}`"));
        }
        // `Enum::Variant` whose variant is a resolved name, save safetensors' `Dtype` of a file.
        if i >= 2
            && flat[i - 1] == "::"
            && token.starts_with(|c: char| c.is_ascii_uppercase())
            && resolved(token)
        {
            let owner = &flat[i - 2];
            if owner != "Dtype" && owner.starts_with(|c: char| c.is_ascii_uppercase()) {
                return Some(format!("the variant `{owner}::{token}`"));
            }
        }
    }
    None
}

/// The identifiers and punctuation of `tokens`, groups opened (`::` as one item).
fn flatten(tokens: proc_macro2::TokenStream, out: &mut Vec<String>) {
    let mut colon = false;
    for tree in tokens {
        match tree {
            proc_macro2::TokenTree::Group(g) => flatten(g.stream(), out),
            proc_macro2::TokenTree::Punct(p) if p.as_char() == ':' => {
                if colon {
                    out.push("::".into());
                }
                colon = !colon;
                continue;
            }
            proc_macro2::TokenTree::Punct(p) => out.push(p.as_char().to_string()),
            proc_macro2::TokenTree::Ident(id) => out.push(id.to_string()),
            proc_macro2::TokenTree::Literal(l) => out.push(l.to_string()),
        }
        colon = false;
    }
}

fn mentions(names: &[&'static str], tokens: &str) -> Option<&'static str> {
    let lower = tokens.to_lowercase();
    let words: Vec<&str> = lower.split(|c: char| !c.is_alphanumeric() && c != '_').collect();
    names
        .iter()
        .copied()
        .find(|name| words.iter().any(|w| w == name || w.split('_').any(|part| part == *name)))
}

fn mentions_resolved_name(tokens: &str) -> Option<&'static str> {
    mentions(RESOLVED_NAMES, tokens)
}

impl<'ast> Visit<'ast> for Finder<'_> {
    fn visit_type_trait_object(&mut self, t: &'ast syn::TypeTraitObject) {
        self.report(t.dyn_token.map_or_else(proc_macro2::Span::call_site, |d| d.span), "trait object (dyn)");
        syn::visit::visit_type_trait_object(self, t);
    }

    fn visit_type_fn_ptr(&mut self, t: &'ast syn::TypeFnPtr) {
        self.report(t.fn_token.span, "function pointer type");
        syn::visit::visit_type_fn_ptr(self, t);
    }

    fn visit_expr_match(&mut self, m: &'ast syn::ExprMatch) {
        let scrutinee = quote_tokens(&m.expr);
        let arms: String = m.arms.iter().map(|a| quote_tokens(&a.pat)).collect::<Vec<_>>().join(" ");
        if let Some(name) = mentions_resolved_name(&format!("{scrutinee} {arms}")) {
            self.report(m.match_token.span, &format!("match that mentions `{name}`"));
        }
        syn::visit::visit_expr_match(self, m);
    }

    fn visit_expr_if(&mut self, e: &'ast syn::ExprIf) {
        // `if let` is an `if` whose condition is a `let`: its pattern and value are tested too.
        // The start-up check of a CUDA crate's GPU compares the device's architecture with the
        // one the crate was compiled for: a guard that refuses, as src/cpu.rs's feature checks
        // are, and only there.
        let guard = self.file.ends_with("src/gpu.rs") && quote_tokens(&e.cond).contains("CUDA_ARCH");
        if let Some(why) = dispatches(e.cond.to_token_stream())
            && !guard
        {
            self.report(e.if_token.span, &format!("`if` over {why}"));
        }
        syn::visit::visit_expr_if(self, e);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let name = mac.path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default();
        if (name == "matches" || name == "cfg")
            && let Some(why) = dispatches(mac.tokens.clone())
        {
            self.report(mac.path.segments[0].ident.span(), &format!("`{name}!` over {why}"));
        }
        if name.ends_with("_feature_detected") && !self.file.ends_with("src/cpu.rs") {
            self.report(
                mac.path.segments[0].ident.span(),
                "CPU feature detection outside the start-up check",
            );
        }
        syn::visit::visit_macro(self, mac);
    }
}

fn quote_tokens<T: ToTokens>(t: &T) -> String {
    t.to_token_stream().to_string()
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn problems_in(path: &Path, source: &str) -> Vec<String> {
    let mut problems = Vec::new();
    // Neither the model's config.json nor the tokenizer's tokenizer_config.json (whose chat
    // template a crate that chats embeds).
    if source.contains("config.json") {
        problems.push(format!("{}: mentions config.json", path.display()));
    }
    let file = syn::parse_file(source).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut finder = Finder { file: path, problems: Vec::new() };
    finder.visit_file(&file);
    problems.extend(finder.problems);
    problems
}

#[test]
fn generated_code_has_no_runtime_dispatch() {
    let generated = workspace_root().join("generated");
    let mut files = Vec::new();
    for entry in std::fs::read_dir(&generated).unwrap().flatten() {
        let src = entry.path().join("src");
        if src.is_dir() {
            rust_files(&src, &mut files);
        }
    }
    assert!(files.len() >= 20, "found only {} generated Rust files", files.len());
    let mut problems = Vec::new();
    for path in &files {
        problems.extend(problems_in(path, &std::fs::read_to_string(path).unwrap()));
    }
    assert!(problems.is_empty(), "runtime dispatch in generated code:\n{}", problems.join("\n"));
}

#[test]
fn the_checker_catches_each_kind_of_dispatch() {
    let cases = [
        ("fn f(k: &dyn Kernel) {}", "dyn"),
        ("fn f(k: fn(&[f32]) -> f32) {}", "function pointer"),
        ("fn f(d: Dtype) { match d { Dtype::F32 => {}, Dtype::Bf16 => {} } }", "match"),
        ("fn f() { if std::arch::is_x86_feature_detected!(\"avx2\") {} }", "feature detection"),
        ("const C: &str = \"config.json\";", "config.json"),
        ("fn f() { if DTYPE == Dtype::Bf16 {} }", "if over a dtype"),
        ("fn f(w: W) { if let Weights::Int8(q) = w {} }", "if let over a dtype"),
        (
            "fn f<T: 'static>() { if std::any::TypeId::of::<T>() == std::any::TypeId::of::<u16>() {} }",
            "if over a type",
        ),
        (
            "fn f<T>() -> bool { std::any::type_name::<T>().len() > 3 && matches!(DEVICE, Device::Cuda) }",
            "matches! over a device",
        ),
        ("fn f() { if cfg!(target_feature = \"avx512f\") {} }", "cfg! over a feature"),
    ];
    for (source, what) in cases {
        let found = problems_in(Path::new("src/model.rs"), source);
        assert!(!found.is_empty(), "{what} was not caught in {source}");
    }
    for fine in [
        "fn f(e: E) -> u8 { match e { E::Io => 3, E::Other => 2 } }",
        "fn f(x: f32) -> bool { if x > f32::MAX { return true } matches!(x.classify(), std::num::FpCategory::Nan) }",
        "fn f(s: Option<u32>) { if let Some(id) = s {} }",
        "fn f(dtype: Dtype) -> usize { if dtype == Dtype::F32 { 4 } else { 2 } }",
        "fn f(bf16: bool, rows: usize) { if bf16 && rows < MAX_BATCH {} }",
    ] {
        assert!(problems_in(Path::new("src/model.rs"), fine).is_empty(), "{fine} is not dispatch");
    }
    // The start-up check asks the CPU what it has.
    let check = "fn f() { if !std::arch::is_x86_feature_detected!(\"avx2\") {} }";
    assert!(problems_in(Path::new("src/cpu.rs"), check).is_empty());
}
