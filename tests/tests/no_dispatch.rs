//! Every committed generated Rust file is free of runtime dispatch: no `dyn`, no function
//! pointer types, no `match` over architectures, dtypes or devices, no CPU feature
//! detection outside the start-up check, and nothing that reads config.json.

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

fn mentions_resolved_name(tokens: &str) -> Option<&'static str> {
    let lower = tokens.to_lowercase();
    let words: Vec<&str> = lower.split(|c: char| !c.is_alphanumeric() && c != '_').collect();
    RESOLVED_NAMES
        .iter()
        .copied()
        .find(|name| words.iter().any(|w| w == name || w.split('_').any(|part| part == *name)))
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

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        let name = mac.path.segments.last().map(|s| s.ident.to_string()).unwrap_or_default();
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
    // The model's config.json, not the tokenizer's tokenizer_config.json (chat templates).
    if source.replace("tokenizer_config.json", "").contains("config.json") {
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
    ];
    for (source, what) in cases {
        let found = problems_in(Path::new("src/model.rs"), source);
        assert!(!found.is_empty(), "{what} was not caught in {source}");
    }
    assert!(
        problems_in(Path::new("src/model.rs"), "fn f(e: E) -> u8 { match e { E::Io => 3, E::Other => 2 } }")
            .is_empty()
    );
}
