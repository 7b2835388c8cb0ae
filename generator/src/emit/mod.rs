//! Emission: [`Plan`] + registry sources + templates → the files of a crate, in memory.
//!
//! Nothing here touches the file system: [`emit`] returns a map from relative path to
//! contents, and `write` decides what reaches the disk. Rust files are built with `quote`,
//! parsed from `templates/runtime/` and the registry with `syn`, or, for the forward pass,
//! parsed from `templates/llama/model.rs` or `templates/bert/model.rs` with their slots filled
//! ([`Templates::fill`]), and printed by prettyplease; `monogen.lock` is [`crate::lock::Lock`]
//! serialized; the other files come from the minijinja templates in `templates/`. Every
//! file starts with an `@generated` header carrying a hash of the rest of the file, so
//! that hand edits are detected.

mod bert;
mod common;
mod cuda;
pub mod harness;
mod header;
mod llama;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use header::{HeaderStatus, check_header, with_header};

use crate::Error;
pub use crate::lock::LOCK_FILE;
use crate::lock::Lock;
use crate::plan::{Consts, Plan, human_bytes};
use crate::registry::{Registry, sha256_hex};
use crate::rust_source;

/// The version written into every header and lock file.
pub const MONOGEN_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The generated crate: relative path → contents (header included, LF line endings).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Output {
    pub files: BTreeMap<PathBuf, String>,
}

/// The contents of `templates/`, loaded once.
#[derive(Debug, Clone)]
pub struct Templates {
    /// File name → text, for every file under templates/ (runtime sources as `runtime/x.rs`).
    files: BTreeMap<String, String>,
}

impl Templates {
    pub fn load(root: &Path) -> Result<Templates, Error> {
        let dir = root.join("templates");
        let mut files = BTreeMap::new();
        let mut stack = vec![dir.clone()];
        while let Some(d) = stack.pop() {
            let entries = std::fs::read_dir(&d).map_err(|e| Error::io(&d, e))?;
            for entry in entries {
                let path = entry.map_err(|e| Error::io(&d, e))?.path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
                let name = path.strip_prefix(&dir).unwrap_or(&path).to_string_lossy().replace('\\', "/");
                files.insert(name, text);
            }
        }
        Ok(Templates { files })
    }

    /// These templates with `name` holding `text` instead: what a test of a template edit reads.
    #[cfg(test)]
    pub fn with_file(mut self, name: &str, text: String) -> Templates {
        self.files.insert(name.to_string(), text);
        self
    }

    pub fn get(&self, name: &str) -> Result<&str, Error> {
        self.files
            .get(name)
            .map(String::as_str)
            .ok_or_else(|| Error::Template { name: name.into(), message: "missing from templates/".into() })
    }

    /// Renders a minijinja template with `context`.
    pub fn render(&self, name: &str, context: &impl Serialize) -> Result<String, Error> {
        let mut env = minijinja::Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .keep_trailing_newline(true)
            .build()
            .map_err(|e| template_error(name, e))?;
        env.set_syntax(syntax);
        env.add_filter("toml", toml_filter);
        // Every template, so that `{% include %}` finds the others.
        for (other, text) in self.files.iter().filter(|(n, _)| n.ends_with(".j2")) {
            env.add_template(other, text).map_err(|e| template_error(other, e))?;
        }
        self.get(name)?;
        let template = env.get_template(name).map_err(|e| template_error(name, e))?;
        template
            .render(minijinja::Value::from(minijinja::value::Serde(context)))
            .map_err(|e| template_error(name, e))
    }

    /// Parses a Rust source of `templates/runtime/`, with `__crate` standing for the
    /// generated crate's library name.
    pub fn runtime(&self, file: &str, crate_ident: &str) -> Result<syn::File, Error> {
        self.runtime_with(file, &[("__crate", crate_ident)])
    }

    /// A runtime file with each placeholder ident (`__crate`) replaced.
    pub fn runtime_with(&self, file: &str, replacements: &[(&str, &str)]) -> Result<syn::File, Error> {
        self.rust(&format!("runtime/{file}"), replacements)
    }

    /// A Rust template of `templates/` (`name`, e.g. `llama/model.rs`) with each placeholder
    /// replaced, its lines starting with `//~` (notes on the template itself) left out.
    pub(crate) fn rust(&self, name: &str, replacements: &[(&str, &str)]) -> Result<syn::File, Error> {
        let mut source: String = self
            .get(name)?
            .lines()
            .filter(|l| !l.trim_start().starts_with("//~"))
            .map(|l| format!("{l}\n"))
            .collect();
        for (placeholder, value) in replacements {
            source = source.replace(placeholder, value);
        }
        rust_source::parse_with_comments(&source).map_err(|e| Error::Template {
            name: name.into(),
            message: format!("line {}: {}", e.line, e.message),
        })
    }

    /// A Rust template with its placeholders replaced and its `__slot!(name)`s filled
    /// ([`rust_source::fill_slots`]), printed.
    pub fn fill(
        &self,
        name: &str,
        replacements: &[(&str, &str)],
        slots: &BTreeMap<&str, proc_macro2::TokenStream>,
    ) -> Result<String, Error> {
        Templates::fill_file(name, self.rust(name, replacements)?, slots)
    }

    /// `file`, parsed from template `name` (or assembled from several), with its `__slot!(name)`s
    /// filled, printed.
    pub(crate) fn fill_file(
        name: &str,
        mut file: syn::File,
        slots: &BTreeMap<&str, proc_macro2::TokenStream>,
    ) -> Result<String, Error> {
        rust_source::fill_slots(&mut file, slots)
            .map_err(|message| Error::Template { name: name.into(), message })?;
        // Slots that stood last and came out empty leave their blank line behind.
        Ok(format!("{}\n", rust_source::print(&file).trim_end()))
    }
}

fn template_error(name: &str, e: minijinja::Error) -> Error {
    Error::Template { name: name.into(), message: format!("{e:#}") }
}

/// `{{ value | toml }}`: the value as a TOML literal (strings quoted and escaped).
fn toml_filter(value: minijinja::Value) -> Result<String, minijinja::Error> {
    let json = serde_json::to_value(&value)
        .map_err(|e| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string()))?;
    let toml_value: toml::Value = serde_json::from_value(json)
        .map_err(|e| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e.to_string()))?;
    Ok(toml_value.to_string())
}

/// The name of the library crate for a package name (`a-b` → `a_b`).
pub fn crate_ident(name: &str) -> String {
    name.replace('-', "_")
}

/// The crate's copy of the workload it was generated from.
pub const WORKLOAD_FILE: &str = "workload.toml";

/// Where a crate whose draft model speculates holds the draft model's crate.
pub const DRAFT_DIR: &str = "draft";

/// Generates every file of the crate for `plan`.
pub fn emit(plan: &Plan, registry: &Registry, templates: &Templates) -> Result<Output, Error> {
    let name = &plan.name;
    let mut files: BTreeMap<PathBuf, String> = BTreeMap::new();
    let mut add = |path: &str, body: String| {
        files.insert(PathBuf::from(path), with_header(Path::new(path), &body, name));
    };

    let (rust_files, readme) = match &plan.consts {
        Consts::Llama(c) if plan.target.device == crate::workload::Device::Cuda => {
            (cuda::files(plan, c, registry, templates)?, "README.md.j2")
        }
        Consts::Llama(c) => (llama::rust_files(plan, c, registry, templates)?, "README.md.j2"),
        Consts::Bert(c) => (bert::rust_files(plan, c, registry, templates)?, "bert/README.md.j2"),
    };
    for (path, body) in rust_files {
        add(&path, body);
    }

    let context = ReadmeContext::new(plan, templates)?;
    add("Cargo.toml", templates.render("Cargo.toml.j2", &context)?);
    add("README.md", templates.render(readme, &context)?);
    add(".gitignore", templates.render("gitignore.j2", &context)?);
    // The workload as its file says it, without a header: it is the crate's input, which
    // `monogen build --crate` reads back, and a person may edit it. A draft model's crate's is
    // made from the target's workload, generated as the rest of it is.
    if matches!(&plan.consts, Consts::Llama(c) if c.drafts) {
        files.insert(
            PathBuf::from(WORKLOAD_FILE),
            with_header(Path::new(WORKLOAD_FILE), &plan.workload_file, name),
        );
    } else {
        files.insert(PathBuf::from(WORKLOAD_FILE), plan.workload_file.clone());
    }
    // A draft model's crate, generated whole into `draft/`.
    if let Consts::Llama(c) = &plan.consts
        && let Some(draft) = c.draft()
    {
        for (path, body) in emit(draft, registry, templates)?.files {
            files.insert(Path::new(DRAFT_DIR).join(path), body);
        }
    }

    let lock = Lock {
        format: crate::lock::FORMAT,
        monogen: MONOGEN_VERSION.to_string(),
        workload_sha256: plan.workload_sha256.clone(),
        speculation: match &plan.consts {
            crate::plan::Consts::Llama(c) => c.speculation_measured.as_ref().map(|m| m.chosen.clone()),
            crate::plan::Consts::Bert(_) => None,
        },
        choice: plan
            .interfaces
            .iter()
            .map(|i| crate::lock::Choice {
                interface: i.interface.clone(),
                role: i.role.clone(),
                implementation: i.chosen.name.clone(),
                version: i.chosen.version.clone(),
                source_sha256: i.chosen.source_sha256.clone(),
                candidates_sha256: i.chosen.candidates_sha256.clone(),
            })
            .collect(),
        shared: plan
            .shared_modules
            .iter()
            .map(|m| crate::lock::Shared {
                module: registry.shared[m].name.clone(),
                source_sha256: registry.shared[m].source_sha256.clone(),
            })
            .collect(),
        file: files
            .iter()
            .map(|(p, c)| crate::lock::File {
                path: p.to_string_lossy().replace('\\', "/"),
                sha256: sha256_hex(c.as_bytes()),
            })
            .collect(),
        workload: plan.workload_table.clone(),
    };
    files.insert(PathBuf::from(LOCK_FILE), with_header(Path::new(LOCK_FILE), &lock.render(), name));
    Ok(Output { files })
}

/// What the Cargo.toml and README templates see.
#[derive(Serialize)]
struct ReadmeContext<'a> {
    name: &'a str,
    crate_ident: String,
    description: String,
    monogen_version: &'a str,
    architecture: &'a str,
    /// The architecture as people write it (LLaMA).
    architecture_title: &'a str,
    dtype: &'a str,
    device: &'a str,
    arch: &'a str,
    threads: usize,
    consts: &'a crate::plan::Consts,
    /// Float constants as the workload writes them (f32 prints badly): `rope_theta` and
    /// `rms_norm_eps` of a LLaMA model, `layer_norm_eps` of a BERT model.
    floats: &'a BTreeMap<String, String>,
    interfaces: &'a [crate::plan::InterfacePlan],
    cpu_features: &'a [String],
    footprint: BTreeMap<&'static str, String>,
    /// Whether the chosen matmul packs its weights at load (and saves them packed).
    packed: bool,
    dependencies: Vec<Dependency>,
    /// The crate is a draft model inside another crate (`draft/`): a member of that crate's
    /// workspace, whose profiles are the other's.
    nested: bool,
}

#[derive(Serialize)]
pub(crate) struct Dependency {
    name: String,
    spec: String,
}

impl<'a> ReadmeContext<'a> {
    fn new(plan: &'a Plan, templates: &Templates) -> Result<ReadmeContext<'a>, Error> {
        let w = plan;
        let f = &plan.footprint;
        let architecture = plan.consts.architecture();
        Ok(ReadmeContext {
            name: &w.name,
            crate_ident: crate_ident(&w.name),
            description: w.description.clone(),
            monogen_version: MONOGEN_VERSION,
            architecture: architecture.as_str(),
            architecture_title: architecture.title(),
            dtype: w.weights.dtype.as_str(),
            device: w.target.device.as_str(),
            arch: &w.target.arch,
            threads: w.target.threads,
            consts: &plan.consts,
            floats: &plan.float_literals,
            interfaces: &plan.interfaces,
            cpu_features: &plan.cpu_features,
            footprint: BTreeMap::from([
                ("parameters", f.parameters.to_string()),
                ("weights", human_bytes(f.weight_bytes)),
                ("kv_cache", human_bytes(f.kv_cache_bytes)),
                ("scratch", human_bytes(f.scratch_bytes)),
            ]),
            packed: crate::plan::matmul_packs_weights(&plan.interfaces),
            dependencies: {
                // The runtime's crates, and those of the chosen kernels.
                let mut names: Vec<&str> = match &plan.consts {
                    Consts::Llama(_) if plan.target.device == crate::workload::Device::Cuda => {
                        cuda::DEPENDENCIES.to_vec()
                    }
                    Consts::Llama(c) => llama::dependencies(c),
                    Consts::Bert(c) => bert::dependencies(c),
                };
                for i in &plan.interfaces {
                    names.extend(i.chosen.dependencies.iter().map(String::as_str));
                }
                names.sort_unstable();
                names.dedup();
                let mut deps = dependencies(&names, CLI_DEPENDENCIES, templates)?;
                // A draft model is a crate of its own in `draft/`, its library only.
                if let Consts::Llama(c) = &plan.consts
                    && let Some(draft) = c.draft()
                {
                    deps.push(Dependency {
                        name: "draft_model".into(),
                        spec: format!(
                            "{{ package = \"{}\", path = \"{DRAFT_DIR}\", default-features = false }}",
                            draft.name
                        ),
                    });
                    deps.sort_by(|a, b| a.name.cmp(&b.name));
                }
                deps
            },
            nested: matches!(&plan.consts, Consts::Llama(c) if c.drafts),
        })
    }
}

/// Crates that only the command-line program uses: optional, behind the default `cli` feature,
/// so that a library user of the crate does not build them.
const CLI_DEPENDENCIES: &[&str] = &["clap"];

/// The dependency lines of Cargo.toml for `names`, from `templates/dependencies.toml`; those
/// in `optional` are marked so.
pub(crate) fn dependencies(
    names: &[&str],
    optional: &[&str],
    templates: &Templates,
) -> Result<Vec<Dependency>, Error> {
    let table: toml::Table = toml::from_str(templates.get("dependencies.toml")?)
        .map_err(|e| Error::Template { name: "dependencies.toml".into(), message: e.to_string() })?;
    let mut names: Vec<&str> = names.to_vec();
    names.sort_unstable();
    names
        .into_iter()
        .map(|name| {
            let spec = table.get(name).ok_or_else(|| Error::Template {
                name: "dependencies.toml".into(),
                message: format!("no entry for crate `{name}`"),
            })?;
            let mut spec = match spec {
                toml::Value::Table(t) => t.clone(),
                other => toml::Table::from_iter([("version".to_string(), other.clone())]),
            };
            if optional.contains(&name) {
                spec.insert("optional".into(), true.into());
            }
            let parts: Vec<String> = spec.iter().map(|(k, v)| format!("{k} = {v}")).collect();
            let spec = format!("{{ {} }}", parts.join(", "));
            Ok(Dependency { name: name.to_string(), spec })
        })
        .collect()
}
