//! The schema of an implementation's `manifest.toml`, in one place: the registry reads
//! manifests with it (`Manifest<Device, Dtype>`), and the kernel tests' build script
//! (`tests/kernels/build.rs`, which includes this file) with plain strings for the devices and
//! dtypes, so that a manifest the generator would reject fails that build too.
//!
//! This file depends on nothing but `std` and `serde`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// `implementations/<interface>/<name>/manifest.toml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Manifest<D = String, T = String> {
    /// The interface it implements: the name of its parent folder.
    pub interface: String,
    /// Its name: the name of its folder.
    pub name: String,
    /// `MAJOR.MINOR.PATCH`.
    pub version: String,
    pub summary: String,
    /// Declared priority: what chooses among candidates without measurements.
    pub priority: i64,
    /// Implementations it replaces where both fit.
    #[serde(default)]
    pub shadows: Vec<String>,
    /// Modules of `implementations/_shared/` it uses.
    #[serde(default)]
    pub shared: Vec<String>,
    /// Crates its kernel uses (from `templates/dependencies.toml`).
    #[serde(default)]
    pub dependencies: Vec<String>,
    /// Whether its kernel reads weights that its `pack` rewrote at load.
    #[serde(default)]
    pub packs_weights: bool,
    /// For a kernel that packs: the shared module's function (`module::function`) that gives
    /// the length of a packed `[n, k]` matrix.
    #[serde(default)]
    pub packed_len: Option<String>,
    /// The type in which it hands work to the thread team (`_shared/team.rs`): a struct of its
    /// kernel.rs (`Shared`), or the work type of one of its shared modules
    /// (`avx512_matmul::Product<W>`, the element type placeholders standing for their types).
    #[serde(default)]
    pub team_job: Option<String>,
    /// The element types it takes, for an interface with `[[elements]]` (for example
    /// `{ weights = "bf16", activations = "f32" }` for a matmul): exactly those of one of the
    /// interface's element types, or an array of several (`[{ kv = "f32" }, { kv = "bf16" }]`)
    /// for a kernel that names the differing types by their placeholders (`keys: &[KV]`).
    /// Empty for an interface without.
    #[serde(default)]
    pub elements: Elements,
    #[serde(default = "Constraints::any")]
    pub constraints: Constraints<D, T>,
}

/// A manifest's `elements`: one table of element types, or an array of them.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged, expecting = "a table of element types (`{ kv = \"bf16\" }`), or an array of such tables")]
pub enum Elements {
    One(BTreeMap<String, String>),
    Several(Vec<BTreeMap<String, String>>),
}

impl Default for Elements {
    fn default() -> Elements {
        Elements::One(BTreeMap::new())
    }
}

impl Elements {
    /// Each element type's parameters, in the manifest's order: one (empty for an interface
    /// without element types), or several.
    pub fn each(&self) -> Vec<&BTreeMap<String, String>> {
        match self {
            Elements::One(takes) => vec![takes],
            Elements::Several(list) => list.iter().collect(),
        }
    }

    /// Whether the kernel serves several element types, naming their types by placeholder.
    pub fn several(&self) -> bool {
        matches!(self, Elements::Several(_))
    }
}

/// Whether an interface's placeholder stands for a type: its name is in capitals (`KV`, `W`),
/// as against the parameters (`weights`) or words of documentation (`w`) the others stand for.
/// A kernel of several element types names these types as they are named here.
pub fn is_type_placeholder(name: &str) -> bool {
    name.starts_with(|c: char| c.is_ascii_uppercase())
        && name.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_')
}

/// `source`, a kernel of several element types, as compiled for one of them (`element`, whose
/// `types` fill the interface's placeholders): each type placeholder a type alias (`pub type
/// KV = u16;`), placed after the kernel's module documentation.
pub fn kernel_at_element(source: &str, element: &str, types: &BTreeMap<String, String>) -> String {
    // The file's head: comments (its module documentation), blank lines and inner attributes,
    // which must stay before any item.
    let head_end = source
        .split_inclusive('\n')
        .take_while(|l| {
            let l = l.trim_start();
            l.is_empty() || l.starts_with("//") || l.starts_with("#![")
        })
        .map(str::len)
        .sum::<usize>();
    let mut aliases = String::new();
    for (placeholder, ty) in types.iter().filter(|(p, _)| is_type_placeholder(p)) {
        aliases.push_str(&format!(
            "/// The interface's `{{{placeholder}}}` at element type `{element}`.\npub type {placeholder} = {ty};\n\n"
        ));
    }
    let (head, rest) = source.split_at(head_end);
    let newline = if head.is_empty() || head.ends_with('\n') { "" } else { "\n" };
    format!("{head}{newline}{aliases}{rest}")
}

/// A kernel's `team_job` as a path from the crate's `kernels` module, where the crate's
/// `TeamJob` enum names it: a type of the kernel's own module (`Shared` →
/// `matmul::Shared`), or a shared module's type, each shared module it names under `shared::`,
/// each type placeholder replaced by its type at the kernel's element type (`types`) and each
/// other type of one segment the kernel's own: `avx512_matmul::Product<W>` →
/// `shared::avx512_matmul::Product<u16>`, `kv_split::Split<RoundBf16>` →
/// `shared::kv_split::Split<kv_cache::RoundBf16>`. Kernels that hand
/// the team the same shared type get the same path, and share one variant of the enum.
pub fn team_job_path(
    job: &str,
    kernel_module: &str,
    shared: &[String],
    types: &BTreeMap<String, String>,
) -> String {
    if !job.contains("::") {
        return format!("{kernel_module}::{job}");
    }
    team_job_words(job, shared, types)
        .into_iter()
        .map(|word| match word {
            JobWord::Type(ty) => ty.to_string(),
            JobWord::Shared(module) => format!("shared::{module}"),
            JobWord::Own(ident) => format!("{kernel_module}::{ident}"),
            JobWord::Other(text) => text.to_string(),
        })
        .collect()
}

/// The types of its own kernel that a `team_job` naming a shared module's type takes as
/// arguments (`RoundBf16` in `kv_split::Split<RoundBf16>`): the registry checks that kernel.rs
/// defines them.
pub fn team_job_own_types<'a>(
    job: &'a str,
    shared: &[String],
    types: &BTreeMap<String, String>,
) -> Vec<&'a str> {
    if !job.contains("::") {
        return Vec::new();
    }
    team_job_words(job, shared, types)
        .into_iter()
        .filter_map(|word| match word {
            JobWord::Own(ident) => Some(ident),
            _ => None,
        })
        .collect()
}

/// What a piece of a `team_job` that names a shared module's type stands for.
enum JobWord<'a, 't> {
    /// A type placeholder, as the type it stands for.
    Type(&'t str),
    /// A shared module, at the head of a path.
    Shared(&'a str),
    /// A type of the kernel's own: a path of one segment, in UpperCamelCase.
    Own(&'a str),
    /// Anything else: punctuation, a later segment of a path, a primitive type.
    Other(&'a str),
}

/// `job` cut into its identifiers and the text between them, each classified. Only the first
/// segment of a path is a shared module, a placeholder, or a type of the kernel's own.
fn team_job_words<'a, 't>(
    job: &'a str,
    shared: &[String],
    types: &'t BTreeMap<String, String>,
) -> Vec<JobWord<'a, 't>> {
    let mut words = Vec::new();
    let mut at = 0;
    while at < job.len() {
        let rest = &job[at..];
        let len = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
        if len == 0 {
            let c = rest.chars().next().map_or(1, char::len_utf8);
            words.push(JobWord::Other(&rest[..c]));
            at += c;
            continue;
        }
        let ident = &rest[..len];
        let first_segment = !job[..at].trim_end().ends_with("::");
        let alone = !rest[len..].trim_start().starts_with("::");
        words.push(match types.get(ident) {
            Some(ty) if first_segment && is_type_placeholder(ident) => JobWord::Type(ty),
            _ if first_segment && shared.iter().any(|m| m == ident) => JobWord::Shared(ident),
            _ if first_segment && alone && ident.starts_with(|c: char| c.is_ascii_uppercase()) => {
                JobWord::Own(ident)
            }
            _ => JobWord::Other(ident),
        });
        at += len;
    }
    words
}

/// What an implementation needs from a workload.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Constraints<D = String, T = String> {
    /// Devices it runs on; absent means any.
    #[serde(default = "none")]
    pub devices: Option<Vec<D>>,
    /// `target_arch` values it compiles for; absent means any.
    #[serde(default)]
    pub arches: Option<Vec<String>>,
    /// CPU features it needs, all of them.
    #[serde(default)]
    pub cpu_features: Vec<String>,
    /// For a kernel of several element types: the CPU features it needs beyond
    /// `cpu_features` at one of them, by element type name (`bf16 = ["avx512bw"]`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub element_cpu_features: BTreeMap<String, Vec<String>>,
    /// Weight dtypes it supports; absent means any.
    #[serde(default = "none")]
    pub dtypes: Option<Vec<T>>,
    /// Bounds on the workload's shape parameters, by their names in the workload schema.
    #[serde(default)]
    pub shapes: BTreeMap<String, ShapeBound>,
}

fn none<X>() -> Option<X> {
    None
}

impl<D, T> Constraints<D, T> {
    /// No constraint: every workload fits.
    pub fn any() -> Constraints<D, T> {
        Constraints {
            devices: None,
            arches: None,
            cpu_features: Vec::new(),
            element_cpu_features: BTreeMap::new(),
            dtypes: None,
            shapes: BTreeMap::new(),
        }
    }
}

impl<D, T> Default for Constraints<D, T> {
    fn default() -> Constraints<D, T> {
        Constraints::any()
    }
}

/// Bounds on one shape parameter.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ShapeBound {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multiple_of: Option<usize>,
}

impl ShapeBound {
    /// Why `value` violates the bound, if it does.
    pub fn violation(&self, value: usize) -> Option<String> {
        if let Some(min) = self.min.filter(|&m| value < m) {
            return Some(format!("is {value}, below the minimum {min}"));
        }
        if let Some(max) = self.max.filter(|&m| value > m) {
            return Some(format!("is {value}, above the maximum {max}"));
        }
        if let Some(m) = self.multiple_of.filter(|&m| m > 0 && !value.is_multiple_of(m)) {
            return Some(format!("is {value}, not a multiple of {m}"));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_aliases_go_after_the_head_of_the_kernel() {
        let types =
            BTreeMap::from([("KV".to_string(), "u16".to_string()), ("w".to_string(), "words".to_string())]);
        let alias = "/// The interface's `{KV}` at element type `bf16`.\npub type KV = u16;\n\n";
        // After the module's documentation, a licence line, inner attributes and blank lines;
        // only the type placeholders (in capitals) become aliases.
        let kernel = "// Licence.\r\n//! Σ · docs.\r\n#![allow(unused)]\r\n\r\nuse std::ops::Range;\r\n";
        let at = kernel_at_element(kernel, "bf16", &types);
        assert_eq!(at, kernel.replace("use std", &format!("{alias}use std")));
        // A kernel without a head, and one that is all head, without a final newline.
        assert_eq!(kernel_at_element("fn f() {}\n", "bf16", &types), format!("{alias}fn f() {{}}\n"));
        assert_eq!(kernel_at_element("//! Docs.", "bf16", &types), format!("//! Docs.\n{alias}"));
    }

    #[test]
    fn a_team_job_is_a_path_from_the_kernels_module_at_the_kernels_element_type() {
        let types =
            BTreeMap::from([("W".to_string(), "u16".to_string()), ("w".to_string(), "bits".to_string())]);
        let shared = ["avx512_matmul".to_string(), "kv_split".to_string(), "team".to_string()];
        let path = |job| team_job_path(job, "matmul__avx512_threads__bf16", &shared, &types);
        // A type of the kernel's own.
        assert_eq!(path("Shared"), "matmul__avx512_threads__bf16::Shared");
        // A shared module's, its placeholders filled; a placeholder or module name elsewhere in
        // a path stays as it is, as does a module the kernel does not use.
        assert_eq!(path("avx512_matmul::Product<W>"), "shared::avx512_matmul::Product<u16>");
        assert_eq!(
            path("kv_split::Split<kv_split::AsIs>"),
            "shared::kv_split::Split<shared::kv_split::AsIs>"
        );
        assert_eq!(path("avx512_matmul::W"), "shared::avx512_matmul::W");
        assert_eq!(
            path("other::Job<avx512_matmul::Product<W>, w>"),
            "other::Job<shared::avx512_matmul::Product<u16>, w>"
        );
        // The kernel's own types, among a shared type's arguments; a primitive stays as it is.
        assert_eq!(
            path("kv_split::Split<RoundBf16, f32>"),
            "shared::kv_split::Split<matmul__avx512_threads__bf16::RoundBf16, f32>"
        );
        // Which the registry checks the kernel defines; a placeholder without a type (a kernel
        // of one element type) would be one.
        assert_eq!(team_job_own_types("kv_split::Split<RoundBf16, W>", &shared, &types), ["RoundBf16"]);
        assert_eq!(team_job_own_types("avx512_matmul::Product<W>", &shared, &BTreeMap::new()), ["W"]);
        assert!(team_job_own_types("Shared", &shared, &types).is_empty());
    }
}
