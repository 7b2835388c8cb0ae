//! The registry: interfaces (`interfaces/<name>.toml`), their implementations
//! (`implementations/<interface>/<name>/{manifest.toml, kernel.rs}`) and helper modules
//! that implementations share (`implementations/_shared/<module>.rs`).
//!
//! Loading checks everything that can be checked without a workload: manifests against their
//! schema, every kernel's public items against its interface's declared Rust signatures
//! (with syn), that the CPU features a kernel enables are declared, and that its comments
//! survive re-printing. A registry with any problem does not load: a build never silently
//! leaves out a broken candidate.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use quote::ToTokens;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cpu;
use crate::diagnostics::{Diagnostic, nearest, offset_of};
use crate::manifest::{Elements, is_type_placeholder, kernel_at_element};
use crate::rust_source;
use crate::workload::{Device, Dtype, ELEMENT_PARAMETERS, Shape};

/// Folder of `implementations/` that holds shared helper modules instead of an interface.
pub const SHARED_DIR: &str = "_shared";

/// The shared module of the crate's thread team: a kernel that lists it in `shared` names its
/// job type in `team_job`.
pub const TEAM_MODULE: &str = "team";

/// The file of an implementation that holds its Rust source.
pub const KERNEL_FILE: &str = "kernel.rs";

/// The file of a CUDA implementation that holds the CUDA C its kernel.rs launches.
pub const CUDA_KERNEL_FILE: &str = "kernel.cu";

/// The device a kernel with constraints `c` runs on (see [`Implementation::device`]).
fn device_of(c: &Constraints) -> Device {
    match c.devices.as_deref() {
        Some([only]) => *only,
        _ => Device::Cpu,
    }
}

/// Target arches a manifest may name.
pub const ARCHES: &[&str] = &["x86_64", "aarch64"];

#[derive(Debug, Clone, Default)]
pub struct Registry {
    pub interfaces: BTreeMap<String, Interface>,
    /// Implementations by interface, each list sorted by name.
    pub implementations: BTreeMap<String, Vec<Implementation>>,
    pub shared: BTreeMap<String, SharedModule>,
}

/// An interface: what every implementation of it must expose.
#[derive(Debug, Clone, Serialize)]
pub struct Interface {
    pub name: String,
    pub summary: String,
    pub description: String,
    /// The implementation every other one is checked against, for an interface without
    /// element types; with them, each element type names its own.
    pub reference: Option<String>,
    /// The element types its implementations may take (`[[elements]]`), each with its own
    /// reference; empty for an interface whose implementations all take the same types.
    pub elements: Vec<Element>,
    pub functions: Vec<FnDecl>,
    pub types: Vec<TypeDecl>,
    /// The functions that an implementation which reads its weights in a layout of its own
    /// (`packs_weights = true`) exposes besides `functions` (`[[packing]]`): `pack`, to rewrite
    /// them once at load, and any other the interface's loader calls on packed weights.
    pub packing: Vec<FnDecl>,
    /// Path relative to the project root.
    pub path: PathBuf,
}

/// A function an interface declares. Its signature may hold `{placeholder}`s that each
/// element type fills (`Element::types`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FnDecl {
    pub signature: String,
    pub doc: String,
    /// The element types (by name) whose implementations expose it; absent means all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elements: Option<Vec<String>>,
    /// The device whose implementations expose it (`device = "cuda"`: a launcher of kernels on
    /// GPU buffers); absent means the CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<Device>,
}

/// One element type of an interface: the types its implementations take, as one
/// `[[elements]]` entry of `interfaces/<name>.toml` declares them.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Element {
    /// Its name (`bf16`); docs and `explain` write it after the interface's: `matmul<bf16>`.
    pub name: String,
    pub summary: String,
    /// Parameter → element type (`weights = "bf16"`, `activations = "f32"`, `kv = "bf16"`): an
    /// implementation declares exactly these in its manifest's `elements`, and a workload's
    /// [`crate::workload::Workload::element_types`] pick it.
    pub takes: BTreeMap<String, String>,
    /// The implementation every other one of this element type is checked against.
    pub reference: String,
    /// Placeholder → the Rust it stands for in the interface's signatures (`W = "u16"`).
    #[serde(default)]
    pub types: BTreeMap<String, String>,
}

impl Element {
    /// This element type with each type placeholder standing for its own name (`W = "W"`),
    /// the others as they are (`weights = "w: &[{W}]"`).
    pub fn with_type_names(&self) -> Element {
        let types = self
            .types
            .iter()
            .map(|(k, v)| (k.clone(), if is_type_placeholder(k) { k.clone() } else { v.clone() }))
            .collect();
        Element { types, ..self.clone() }
    }

    /// `text` with this element type's placeholders filled, those inside a placeholder's own
    /// text too (`{weights}` is `w: &[{W}]`): filled again until nothing changes, at most once
    /// per placeholder.
    pub fn fill(&self, text: &str) -> String {
        let mut out = text.to_string();
        for _ in 0..=self.types.len() {
            let next = self.types.iter().fold(out.clone(), |t, (k, v)| t.replace(&format!("{{{k}}}"), v));
            if next == out {
                break;
            }
            out = next;
        }
        out
    }

    /// Whether a workload with these element types uses this one.
    pub fn fits(&self, types: &BTreeMap<&str, &str>) -> bool {
        self.takes.iter().all(|(k, v)| types.get(k.as_str()) == Some(&v.as_str()))
    }
}

impl Interface {
    /// The element type of this interface that a workload with element types `types` uses;
    /// `Ok(None)` for an interface without element types, `Err` when none fits.
    pub fn element_for(&self, types: &BTreeMap<&str, &str>) -> Result<Option<&Element>, String> {
        if self.elements.is_empty() {
            return Ok(None);
        }
        self.elements.iter().find(|e| e.fits(types)).map(Some).ok_or_else(|| {
            let offered: Vec<String> =
                self.elements.iter().map(|e| format!("{{ {} }}", describe_takes(&e.takes))).collect();
            format!(
                "interface `{}` takes {}; the workload has {}",
                self.name,
                offered.join(", or "),
                describe_takes(
                    types.iter().filter(|(k, _)| self.elements.iter().any(|e| e.takes.contains_key(**k)))
                )
            )
        })
    }

    /// The interface as an implementation on `device` exposes it: the functions and types it
    /// declares for that device. An interface that declares none for a device other than the CPU
    /// (the sampler, which runs on the host from logits it is handed) is host code there too, and
    /// exposes its CPU items.
    pub fn for_device(&self, device: Device) -> Interface {
        let on = |d: Option<Device>| d.unwrap_or(Device::Cpu) == device;
        let declares = self.functions.iter().any(|f| on(f.device)) || self.types.iter().any(|t| on(t.device));
        let device = if declares { device } else { Device::Cpu };
        let on = |d: Option<Device>| d.unwrap_or(Device::Cpu) == device;
        Interface {
            functions: self.functions.iter().filter(|f| on(f.device)).cloned().collect(),
            types: self.types.iter().filter(|t| on(t.device)).cloned().collect(),
            packing: self.packing.iter().filter(|f| on(f.device)).cloned().collect(),
            ..self.clone()
        }
    }

    /// The element type `imp` (an implementation of this interface) takes; `None` for an
    /// interface without element types.
    pub fn element_of(&self, imp: &Implementation) -> Option<&Element> {
        self.elements.iter().find(|e| imp.element.as_ref() == Some(&e.name))
    }

    /// The name of the reference implementation of `element` (of the interface itself when
    /// it has no element types).
    pub fn reference_of<'a>(&'a self, element: Option<&'a Element>) -> &'a str {
        element.map_or_else(|| self.reference.as_deref().unwrap_or_default(), |e| e.reference.as_str())
    }

    /// The interface as a kernel of several element types exposes it at `element`: its
    /// functions, each type placeholder standing for itself (`keys: &[KV]`, `w: &[W]`), which
    /// the kernel as compiled for `element` declares as a type alias ([`kernel_at_element`]).
    pub fn at_placeholders(&self, element: &Element) -> Interface {
        self.at(Some(&element.with_type_names()))
    }

    /// The interface as an implementation of `element` must expose it, named `matmul<bf16>`:
    /// the functions of that element type, their placeholders filled.
    pub fn at(&self, element: Option<&Element>) -> Interface {
        let Some(element) = element else { return self.clone() };
        let fill = |text: &str| element.fill(text);
        let specialize = |decls: &[FnDecl]| -> Vec<FnDecl> {
            decls
                .iter()
                .filter(|d| d.elements.as_ref().is_none_or(|names| names.contains(&element.name)))
                .map(|d| FnDecl {
                    signature: fill(&d.signature),
                    doc: fill(&d.doc),
                    elements: None,
                    device: d.device,
                })
                .collect()
        };
        Interface {
            name: format!("{}<{}>", self.name, element.name),
            summary: self.summary.clone(),
            description: self.description.clone(),
            reference: Some(element.reference.clone()),
            elements: Vec::new(),
            functions: specialize(&self.functions),
            types: self
                .types
                .iter()
                .map(|t| TypeDecl {
                    declaration: fill(&t.declaration),
                    doc: fill(&t.doc),
                    methods: t.methods.iter().map(|m| fill(m)).collect(),
                    device: t.device,
                })
                .collect(),
            packing: specialize(&self.packing),
            path: self.path.clone(),
        }
    }
}

/// `weights = bf16, activations = f32`.
pub fn describe_takes<K: AsRef<str>, V: AsRef<str>>(takes: impl IntoIterator<Item = (K, V)>) -> String {
    takes.into_iter().map(|(k, v)| format!("{} = {}", k.as_ref(), v.as_ref())).collect::<Vec<_>>().join(", ")
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TypeDecl {
    pub declaration: String,
    pub doc: String,
    #[serde(default)]
    pub methods: Vec<String>,
    /// The device whose implementations define it; absent means the CPU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<Device>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct InterfaceFile {
    name: String,
    summary: String,
    description: String,
    #[serde(default)]
    reference: Option<String>,
    #[serde(default)]
    elements: Vec<Element>,
    #[serde(default)]
    functions: Vec<FnDecl>,
    #[serde(default)]
    types: Vec<TypeDecl>,
    #[serde(default)]
    packing: Vec<FnDecl>,
}

/// One implementation of an interface.
#[derive(Debug, Clone, Serialize)]
pub struct Implementation {
    pub interface: String,
    pub name: String,
    pub version: String,
    pub summary: String,
    pub priority: i64,
    pub shadows: Vec<String>,
    pub shared: Vec<String>,
    /// Crates the kernel uses (`use gemm::...`), by their names in
    /// `templates/dependencies.toml`; a crate that chooses the implementation depends on them.
    pub dependencies: Vec<String>,
    /// Whether the kernel reads its weights in a layout of its own, which its interface's
    /// packing function (also in the kernel) writes once at load.
    pub packs_weights: bool,
    /// For a kernel that packs its weights: the function of one of its shared modules that
    /// gives the length of a packed `[n, k]` matrix (what `pack` returns), as
    /// `module::function`. A crate checks a saved model's packed matrices against it.
    pub packed_len: Option<String>,
    /// The type in which the kernel hands work to the crate's thread team, [`TEAM_MODULE`]: a
    /// `pub(crate)` struct of kernel.rs, or a shared module's work type
    /// (`avx512_matmul::Product<W>`), as its manifest names it. A crate with such kernels gets
    /// an enum of their job types (`kernels::TeamJob`) for the team's workers to run; see
    /// [`Implementation::team_job_path`].
    pub team_job: Option<String>,
    /// The element types it takes (its manifest's `elements`), and the name of the interface's
    /// element type they make (`None` for an interface without element types).
    pub elements: BTreeMap<String, String>,
    pub element: Option<String>,
    /// Whether its folder serves several element types (its manifest's `elements` is an
    /// array): the registry holds one entry per element type, each with its own `source` (the
    /// placeholders made type aliases), and its records and module names carry the element type.
    pub several_elements: bool,
    /// What its element type's type placeholders stand for (`W` → `u16`), which its compiled
    /// `source` declares as aliases, where its folder serves several element types; else empty.
    pub types: BTreeMap<String, String>,
    pub constraints: Constraints,
    /// Folder relative to the project root.
    pub dir: PathBuf,
    #[serde(skip)]
    pub source: Arc<str>,
    /// A CUDA implementation's kernels (`kernel.cu`, CUDA C), which its kernel.rs launches:
    /// copied into a crate as `src/kernels/<interface>.cu` after the workload's constants.
    #[serde(skip)]
    pub cuda_source: Option<Arc<str>>,
    /// sha256 of kernel.rs (followed by kernel.cu where there is one), hex.
    pub source_sha256: String,
}

impl Implementation {
    /// The device its kernel runs on: the one its constraints name where they name one device,
    /// else the CPU (host code, as the sampler's, which any crate runs on its CPU).
    pub fn device(&self) -> Device {
        device_of(&self.constraints)
    }

    /// The type it hands to the crate's thread team (`team_job`), as a path from the crate's
    /// `kernels` module where its kernel is module `module`: `matmul::Shared`, or
    /// `shared::avx512_matmul::Product<u16>` (its placeholders filled at its element type).
    pub fn team_job_path(&self, module: &str) -> Option<String> {
        let job = self.team_job.as_deref()?;
        Some(crate::manifest::team_job_path(job, module, &self.shared, &self.types))
    }
}

#[cfg(test)]
impl Implementation {
    /// An implementation of `interface` with no constraints, no kernel and priority 0.
    pub(crate) fn for_tests(interface: &str, name: &str) -> Implementation {
        Implementation {
            interface: interface.into(),
            name: name.into(),
            version: "1.0.0".into(),
            summary: String::new(),
            priority: 0,
            shadows: vec![],
            shared: vec![],
            dependencies: vec![],
            packs_weights: false,
            packed_len: None,
            team_job: None,
            elements: BTreeMap::new(),
            element: None,
            several_elements: false,
            types: BTreeMap::new(),
            constraints: Constraints::default(),
            dir: format!("implementations/{interface}/{name}").into(),
            source: Arc::from(""),
            cuda_source: None,
            source_sha256: String::new(),
        }
    }
}

/// What an implementation needs from a workload (the schema is in [`crate::manifest`]).
pub type Constraints = crate::manifest::Constraints<Device, Dtype>;
pub use crate::manifest::ShapeBound;

/// A manifest as the registry reads it.
type ManifestFile = crate::manifest::Manifest<Device, Dtype>;

/// A helper module that several implementations use.
#[derive(Debug, Clone, Serialize)]
pub struct SharedModule {
    pub name: String,
    pub path: PathBuf,
    /// CPU features its functions enable with `#[target_feature]`.
    pub enabled_features: Vec<String>,
    #[serde(skip)]
    pub source: Arc<str>,
    pub source_sha256: String,
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    let digest = Sha256::digest(bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

impl Registry {
    /// Loads and checks the registry under `root`.
    pub fn load(root: &Path) -> Result<Registry, Vec<Diagnostic>> {
        let mut problems = Vec::new();
        let interfaces = load_interfaces(root, &mut problems);
        let shared = load_shared(root, &mut problems);
        let mut implementations: BTreeMap<String, Vec<Implementation>> = BTreeMap::new();
        let impl_root = root.join("implementations");
        for interface_dir in sorted_dirs(&impl_root, &mut problems) {
            let interface_name = file_name(&interface_dir);
            if interface_name == SHARED_DIR {
                continue;
            }
            if !interfaces.contains_key(&interface_name) {
                let hint = match nearest(&interface_name, interfaces.keys().map(String::as_str)) {
                    Some(near) => format!("did you mean `{near}`?"),
                    None => {
                        format!("interfaces: {}", interfaces.keys().cloned().collect::<Vec<_>>().join(", "))
                    }
                };
                problems.push(
                    Diagnostic::new(format!("implementations/{interface_name} names no interface"))
                        .at_path(&relative(root, &interface_dir))
                        .hint(format!("add interfaces/{interface_name}.toml, or move the folder; {hint}")),
                );
                continue;
            }
            for dir in sorted_dirs(&interface_dir, &mut problems) {
                for imp in
                    load_implementation(root, &dir, &interfaces, &shared, &mut problems).into_iter().flatten()
                {
                    implementations.entry(imp.interface.clone()).or_default().push(imp);
                }
            }
        }
        for (name, imps) in &implementations {
            let cycle = shadow_cycles(imps);
            if !cycle.is_empty() {
                problems.push(Diagnostic::new(format!(
                    "implementations of `{name}` shadow each other in a cycle: {}",
                    cycle.join(", ")
                ))
                .hint("shadowing says which implementation replaces which; it must not go round in a circle"));
            }
            let names: BTreeSet<&str> = imps.iter().map(|i| i.name.as_str()).collect();
            // A folder of several element types is one entry per type: judge its manifest once.
            let mut judged = BTreeSet::new();
            for imp in imps.iter().filter(|i| judged.insert(i.name.as_str())) {
                for shadowed in &imp.shadows {
                    if shadowed == &imp.name || !names.contains(shadowed.as_str()) {
                        problems.push(
                            Diagnostic::new(format!(
                                "{}/{} shadows `{shadowed}`, which is not another implementation of `{name}`",
                                imp.interface, imp.name
                            ))
                            .at_path(&imp.dir.join("manifest.toml")),
                        );
                    }
                }
            }
        }
        for interface in interfaces.values() {
            let elements: Vec<Option<&Element>> = match interface.elements.is_empty() {
                true => vec![None],
                false => interface.elements.iter().map(Some).collect(),
            };
            for element in elements {
                let reference = interface.reference_of(element);
                let has_reference = implementations.get(&interface.name).is_some_and(|imps| {
                    imps.iter().any(|i| {
                        i.name == reference && i.element.as_deref() == element.map(|e| e.name.as_str())
                    })
                });
                if !has_reference {
                    let of = element.map(|e| format!(" of element type `{}`", e.name)).unwrap_or_default();
                    problems.push(
                        Diagnostic::new(format!(
                            "interface `{}` names `{reference}` as its reference{of}, but implementations/{}/{reference} does not exist, takes other types or was rejected",
                            interface.name, interface.name
                        ))
                        .at_path(&interface.path),
                    );
                }
            }
        }
        if problems.is_empty() { Ok(Registry { interfaces, implementations, shared }) } else { Err(problems) }
    }

    pub fn implementations_of(&self, interface: &str) -> &[Implementation] {
        self.implementations.get(interface).map_or(&[], Vec::as_slice)
    }

    /// The implementation `name` of `interface` at element type `element` (`None` for an
    /// interface without element types).
    pub fn implementation(
        &self,
        interface: &str,
        name: &str,
        element: Option<&str>,
    ) -> Option<&Implementation> {
        self.implementations_of(interface).iter().find(|i| i.name == name && i.element.as_deref() == element)
    }
}

fn relative(root: &Path, path: &Path) -> PathBuf {
    path.strip_prefix(root).unwrap_or(path).to_path_buf()
}

fn file_name(path: &Path) -> String {
    path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default()
}

fn sorted_dirs(dir: &Path, problems: &mut Vec<Diagnostic>) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    match std::fs::read_dir(dir) {
        Ok(entries) => {
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    dirs.push(entry.path());
                }
            }
        }
        Err(e) => {
            problems.push(Diagnostic::new(format!("cannot read the registry folder: {e}")).at_path(dir))
        }
    }
    dirs.sort();
    dirs
}

fn read_text(root: &Path, path: &Path, problems: &mut Vec<Diagnostic>) -> Option<Arc<str>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Some(Arc::from(text)),
        Err(e) => {
            problems.push(Diagnostic::new(format!("cannot read: {e}")).at_path(&relative(root, path)));
            None
        }
    }
}

fn toml_diag(path: &Path, text: &Arc<str>, e: &toml::de::Error) -> Diagnostic {
    let message = e.message().lines().next().unwrap_or("invalid TOML").to_string();
    Diagnostic::new(message).in_file(path, text).primary(e.span().unwrap_or(0..0), "")
}

fn load_interfaces(root: &Path, problems: &mut Vec<Diagnostic>) -> BTreeMap<String, Interface> {
    let mut out = BTreeMap::new();
    let dir = root.join("interfaces");
    let mut files: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(entries) => entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect(),
        Err(e) => {
            problems.push(Diagnostic::new(format!("cannot read the interfaces folder: {e}")).at_path(&dir));
            return out;
        }
    };
    files.sort();
    for path in files {
        let rel = relative(root, &path);
        let Some(text) = read_text(root, &path, problems) else { continue };
        let file: InterfaceFile = match toml::from_str(&text) {
            Ok(f) => f,
            Err(e) => {
                problems.push(toml_diag(&rel, &text, &e));
                continue;
            }
        };
        let stem = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
        if file.name != stem {
            problems.push(
                Diagnostic::new(format!(
                    "interface name `{}` differs from its file name `{stem}.toml`",
                    file.name
                ))
                .at_path(&rel),
            );
            continue;
        }
        let interface = Interface {
            name: file.name,
            summary: file.summary,
            description: file.description,
            reference: file.reference,
            elements: file.elements,
            functions: file.functions,
            types: file.types,
            packing: file.packing,
            path: rel,
        };
        let found = check_interface(&interface);
        if found.is_empty() {
            out.insert(interface.name.clone(), interface);
        }
        problems.extend(found);
    }
    out
}

/// What is wrong with an interface file: a reference where element types name their own (or
/// none at all), an element type named twice, a function limited to an unknown element
/// type, or a declaration that does not parse once an element type fills its placeholders.
fn check_interface(interface: &Interface) -> Vec<Diagnostic> {
    let mut problems = Vec::new();
    let name = &interface.name;
    let diag = |message: String| Diagnostic::new(message).at_path(&interface.path);
    match (&interface.reference, interface.elements.is_empty()) {
        (None, true) => problems.push(
            diag(format!("interface `{name}` names no reference"))
                .hint("add `reference = \"<implementation>\"`, the one every other is checked against"),
        ),
        (Some(_), false) => problems.push(diag(format!(
            "interface `{name}` names a `reference` and `[[elements]]`: each element type names its own"
        ))),
        _ => {}
    }
    let names: Vec<&str> = interface.elements.iter().map(|e| e.name.as_str()).collect();
    for (i, element) in interface.elements.iter().enumerate() {
        if names[..i].contains(&element.name.as_str()) {
            problems.push(diag(format!("interface `{name}` declares element type `{}` twice", element.name)));
        }
        if element.takes.is_empty() {
            problems.push(diag(format!("interface `{name}`: element type `{}` takes nothing", element.name)));
        }
        for key in element.takes.keys().filter(|k| !ELEMENT_PARAMETERS.contains(&k.as_str())) {
            problems.push(
                diag(format!(
                    "interface `{name}`: element type `{}` takes `{key}`, which no workload has",
                    element.name
                ))
                .hint(format!("a workload has element types {}", ELEMENT_PARAMETERS.join(", "))),
            );
        }
        // A workload that fits one element type must fit no other: no `takes` within another's.
        let within = |a: &Element, b: &Element| a.takes.iter().all(|(k, v)| b.takes.get(k) == Some(v));
        if let Some(other) = interface.elements[..i].iter().find(|e| within(e, element) || within(element, e))
        {
            problems.push(diag(format!(
                "interface `{name}`: a workload that fits element type `{}` ({}) can fit `{}` ({}) too",
                element.name,
                describe_takes(&element.takes),
                other.name,
                describe_takes(&other.takes)
            )));
        }
    }
    for f in interface.functions.iter().chain(&interface.packing) {
        for limited in f.elements.iter().flatten().filter(|e| !names.contains(&e.as_str())) {
            problems.push(diag(format!(
                "interface `{name}`: `{}` is limited to element type `{limited}`, which it does not declare",
                f.signature
            )));
        }
    }
    let views: Vec<Interface> = if interface.elements.is_empty() {
        vec![interface.clone()]
    } else {
        interface.elements.iter().map(|e| interface.at(Some(e))).collect()
    };
    for view in &views {
        // `matmul<bf16>` where the element type filled the placeholders.
        let name = &view.name;
        for f in view.functions.iter().chain(&view.packing) {
            if let Err(e) = parse_fn_decl(&f.signature) {
                problems.push(
                    diag(format!("interface `{name}`: signature does not parse: {e}"))
                        .note(f.signature.clone()),
                );
            }
        }
        for t in &view.types {
            if let Err(e) = syn::parse_str::<syn::ItemStruct>(&format!("{};", t.declaration)) {
                problems.push(
                    diag(format!("interface `{name}`: type declaration does not parse: {e}"))
                        .note(t.declaration.clone()),
                );
            }
            for m in &t.methods {
                if let Err(e) = parse_fn_decl(m) {
                    problems.push(
                        diag(format!("interface `{name}`: method does not parse: {e}")).note(m.clone()),
                    );
                }
            }
        }
    }
    problems
}

fn load_shared(root: &Path, problems: &mut Vec<Diagnostic>) -> BTreeMap<String, SharedModule> {
    let mut out = BTreeMap::new();
    let dir = root.join("implementations").join(SHARED_DIR);
    let Ok(entries) = std::fs::read_dir(&dir) else { return out };
    let mut files: Vec<PathBuf> =
        entries.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "rs")).collect();
    files.sort();
    for path in files {
        let rel = relative(root, &path);
        let Some(source) = read_text(root, &path, problems) else { continue };
        let file = match rust_source::parse_with_comments(&source) {
            Ok(file) => file,
            Err(e) => {
                problems.push(source_diag(&rel, &source, &e));
                continue;
            }
        };
        let name = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
        let source_sha256 = sha256_hex(source.as_bytes());
        let enabled_features = enabled_features(&file).into_iter().map(|(f, _)| f).collect();
        out.insert(name.clone(), SharedModule { name, path: rel, enabled_features, source, source_sha256 });
    }
    out
}

fn source_diag(rel: &Path, source: &Arc<str>, e: &rust_source::SourceError) -> Diagnostic {
    let offset = offset_of(source, e.line, e.column);
    Diagnostic::new(e.message.clone()).in_file(rel, source).primary(offset..offset + 1, "")
}

/// Why `path` (a manifest's `packed_len`) does not name a `pub fn (usize, usize) -> usize` of
/// one of the shared modules `uses`, if it does not.
fn check_packed_len(path: &str, uses: &[String], shared: &BTreeMap<String, SharedModule>) -> Option<String> {
    let Some((module, function)) = path.split_once("::") else {
        return Some(format!("`packed_len = \"{path}\"` is not of the form `<module>::<function>`"));
    };
    if !uses.iter().any(|s| s == module) {
        return Some(format!("`packed_len` names shared module `{module}`, which `shared` does not list"));
    }
    // A missing module is reported with `shared`.
    let source = &shared.get(module)?.source;
    let file = rust_source::parse_with_comments(source).ok()?;
    let found = file.items.iter().find_map(|item| match item {
        syn::Item::Fn(f) if f.sig.ident == function => Some(f),
        _ => None,
    });
    let Some(f) = found else {
        return Some(format!("shared module `{module}` has no function `{function}`"));
    };
    let usize_type: syn::Type = syn::parse_quote!(usize);
    let takes_two_usizes = f.sig.inputs.len() == 2
        && f.sig.inputs.iter().all(|input| matches!(input, syn::FnArg::Typed(t) if *t.ty == usize_type));
    let returns_usize = matches!(&f.sig.output, syn::ReturnType::Type(_, ty) if **ty == usize_type);
    let public = matches!(f.vis, syn::Visibility::Public(_));
    if !(public
        && takes_two_usizes
        && returns_usize
        && f.sig.generics.params.is_empty()
        && !matches!(f.sig.safety, syn::Safety::Unsafe(_)))
    {
        return Some(format!(
            "`{path}` is `{}`; `packed_len` needs a safe `pub fn {function}(n: usize, k: usize) -> usize`",
            pretty_signature(&f.vis, &f.sig)
        ));
    }
    None
}

pub(crate) fn parse_fn_decl(signature: &str) -> syn::Result<syn::ForeignItemFn> {
    syn::parse_str::<syn::ForeignItemFn>(&format!("{signature};"))
}

/// Loads the implementation in `dir` and checks its manifest and kernel: one entry per element
/// type it takes (one for an interface without element types); None, with every problem found
/// added to `problems`, when it has any.
fn load_implementation(
    root: &Path,
    dir: &Path,
    interfaces: &BTreeMap<String, Interface>,
    shared: &BTreeMap<String, SharedModule>,
    problems: &mut Vec<Diagnostic>,
) -> Option<Vec<Implementation>> {
    let rel_dir = relative(root, dir);
    let manifest_path = dir.join("manifest.toml");
    let rel_manifest = rel_dir.join("manifest.toml");
    let text = read_text(root, &manifest_path, problems)?;
    let m: ManifestFile = match toml::from_str(&text) {
        Ok(m) => m,
        Err(e) => {
            problems.push(toml_diag(&rel_manifest, &text, &e));
            return None;
        }
    };
    let before = problems.len();
    let doc = toml::de::DeTable::parse(&text).ok();
    let span = |path: &[&str]| doc.as_ref().and_then(|d| crate::workload::span_of(d, path)).unwrap_or(0..0);
    let diag = |message: String, path: &[&str]| {
        Diagnostic::new(message).in_file(&rel_manifest, &text).primary(span(path), "")
    };

    check_manifest_identity(&m, dir, &diag, problems);
    check_constraints(&m.constraints, &diag, problems);
    check_shared_uses(&m, shared, &diag, problems);

    let kernel_path = dir.join(KERNEL_FILE);
    let rel_kernel = rel_dir.join(KERNEL_FILE);
    let source = read_text(root, &kernel_path, problems)?;
    let device = device_of(&m.constraints);
    let cuda_path = dir.join(CUDA_KERNEL_FILE);
    let cuda_source = if cuda_path.exists() {
        let text = read_text(root, &cuda_path, problems)?;
        if device != Device::Cuda {
            problems.push(
                diag(
                    format!(
                        "{} is CUDA C, but the implementation does not run on `cuda` alone",
                        CUDA_KERNEL_FILE
                    ),
                    &["constraints", "devices"],
                )
                .hint("a CUDA implementation's manifest says `devices = [\"cuda\"]`"),
            );
        } else if !text.contains("extern \"C\" __global__") {
            problems.push(
                Diagnostic::new(format!("{} defines no kernel", rel_dir.join(CUDA_KERNEL_FILE).display()))
                    .hint("its kernels are `extern \"C\" __global__` functions, which its kernel.rs launches by name"),
            );
        }
        Some(text)
    } else {
        None
    };
    let interface = &interfaces.get(&m.interface)?.for_device(device);
    let several = m.elements.several();
    check_element_list(&m, interface, &diag, problems);
    let mut out = Vec::new();
    for takes in m.elements.each() {
        // The manifest as it reads at this element type: its types, and its CPU features.
        let mut at = m.clone();
        at.elements = Elements::One(takes.clone());
        at.constraints.element_cpu_features.clear();
        let element = match element_of(&at, interface) {
            Ok(e) => e,
            Err(why) => {
                problems.push(diag(why, &["elements"]).hint(format!(
                    "declare the element types it takes as one of the `[[elements]]` of {}",
                    interface.path.display()
                )));
                break;
            }
        };
        let extra = element.and_then(|e| m.constraints.element_cpu_features.get(&e.name));
        at.constraints.cpu_features.extend(extra.into_iter().flatten().cloned());
        // A kernel of several element types names their types (`KV`), which the source it
        // is compiled from declares as aliases.
        let (view, compiled): (Interface, Arc<str>) = match (several, element) {
            (true, Some(e)) => {
                (interface.at_placeholders(e), kernel_at_element(&source, &e.name, &e.types).into())
            }
            _ => (interface.at(element), source.clone()),
        };
        // The types its element type's type placeholders stand for, which `compiled` declares.
        let types: BTreeMap<String, String> = match (several, element) {
            (true, Some(e)) => e
                .types
                .iter()
                .filter(|(p, _)| is_type_placeholder(p))
                .map(|(p, t)| (p.clone(), t.clone()))
                .collect(),
            _ => BTreeMap::new(),
        };
        let before_kernel = problems.len();
        check_kernel(&at, &view, &types, &source, &rel_kernel, &diag, problems);
        if problems.len() > before_kernel {
            // The other element types would only say the same of the same kernel.
            break;
        }
        out.push(Implementation {
            interface: at.interface,
            name: at.name,
            version: at.version,
            summary: at.summary,
            priority: at.priority,
            shadows: at.shadows,
            shared: at.shared,
            dependencies: at.dependencies,
            packs_weights: at.packs_weights,
            packed_len: at.packed_len,
            team_job: at.team_job,
            elements: takes.clone(),
            element: element.map(|e| e.name.clone()),
            several_elements: several,
            types,
            constraints: at.constraints,
            dir: rel_dir.clone(),
            source: compiled,
            cuda_source: cuda_source.clone(),
            source_sha256: match &cuda_source {
                Some(cu) => sha256_hex(format!("{source}\n// {CUDA_KERNEL_FILE}\n{cu}").as_bytes()),
                None => sha256_hex(source.as_bytes()),
            },
        });
    }
    if problems.len() > before {
        return None;
    }
    Some(out)
}

/// A manifest's array of element types: an interface with element types, no element type
/// twice, placeholders that are types (the kernel names them as types: `keys: &[KV]`), and
/// `element_cpu_features` only for element types it takes.
fn check_element_list(
    m: &ManifestFile,
    interface: &Interface,
    diag: &ManifestDiag,
    problems: &mut Vec<Diagnostic>,
) {
    let each = m.elements.each();
    let names: Vec<&str> = each
        .iter()
        .filter_map(|takes| interface.elements.iter().find(|e| &&e.takes == takes))
        .map(|e| e.name.as_str())
        .collect();
    if m.elements.several() {
        if each.len() < 2 {
            problems.push(
                diag("`elements` is an array of fewer than two element types".into(), &["elements"])
                    .hint("declare one element type as a table: `elements = { kv = \"bf16\" }`"),
            );
        }
        if let Some(twice) = names.iter().enumerate().find(|(i, n)| names[..*i].contains(n)) {
            problems.push(diag(format!("`elements` lists element type `{}` twice", twice.1), &["elements"]));
        }
        let listed: Vec<&Element> =
            interface.elements.iter().filter(|e| names.contains(&e.name.as_str())).collect();
        let hint = "a kernel of several element types names their types by placeholder (`keys: &[KV]`); \
                    write one folder per element type here";
        let in_signatures = |placeholder: &str| {
            let token = format!("{{{placeholder}}}");
            interface.functions.iter().chain(&interface.packing).any(|d| d.signature.contains(&token))
        };
        for element in &listed {
            for (placeholder, text) in &element.types {
                if is_type_placeholder(placeholder) && syn::parse_str::<syn::Type>(text).is_err() {
                    let message = format!(
                        "`elements` lists several element types, but `{{{placeholder}}}` of `{}<{}>` stands for `{text}`, which is not a type",
                        interface.name, element.name
                    );
                    problems.push(diag(message, &["elements"]).hint(hint));
                }
            }
        }
        // The other placeholders of the signatures (`{weights}`) must read the same at every
        // element type, their types named: the kernel has one signature for all of them.
        if let Some((first, rest)) = listed.split_first() {
            for placeholder in first.types.keys().filter(|p| in_signatures(p)) {
                let token = format!("{{{placeholder}}}");
                let text = first.with_type_names().fill(&token);
                for other in rest {
                    let theirs = other.with_type_names().fill(&token);
                    if theirs != text {
                        let message = format!(
                            "`elements` lists several element types, but `{{{placeholder}}}` differs between them: `{text}` at `{}`, `{theirs}` at `{}`",
                            first.name, other.name
                        );
                        problems.push(diag(message, &["elements"]).hint(hint));
                    }
                }
            }
        }
    }
    for (name, features) in &m.constraints.element_cpu_features {
        let at = ["constraints", "element_cpu_features", name.as_str()];
        if !m.elements.several() {
            problems.push(
                diag("`element_cpu_features`, but `elements` names one element type".into(), &at)
                    .hint("declare the CPU features of a kernel of one element type in `cpu_features`"),
            );
        } else if !names.contains(&name.as_str()) {
            problems.push(diag(
                format!("`element_cpu_features` names `{name}`, which is not an element type it takes"),
                &at,
            ));
        }
        for f in features.iter().filter(|f| !cpu::X86_64_FEATURES.contains(&f.as_str())) {
            problems.push(
                diag(format!("unknown CPU feature `{f}`"), &at)
                    .hint(format!("known: {}", cpu::X86_64_FEATURES.join(", "))),
            );
        }
        // (`check_constraints` says so already where `cpu_features` lists some.)
        if !features.is_empty() && m.constraints.arches.is_none() && m.constraints.cpu_features.is_empty() {
            problems.push(
                diag("CPU features are declared without `arches`".into(), &["constraints"])
                    .hint("add `arches = [\"x86_64\"]`"),
            );
        }
    }
}

/// The element type of `interface` whose types the manifest declares (`None` for an interface
/// without element types); `Err` with why not: its `elements` are none of the interface's
/// element types, or it declares some for an interface without any.
fn element_of<'i>(m: &ManifestFile, interface: &'i Interface) -> Result<Option<&'i Element>, String> {
    let none = BTreeMap::new();
    let takes = m.elements.each().first().copied().unwrap_or(&none);
    let declared = describe_takes(takes);
    if interface.elements.is_empty() {
        return match takes.is_empty() {
            true => Ok(None),
            false => Err(format!(
                "`elements = {{ {declared} }}`, but interface `{}` has no element types",
                interface.name
            )),
        };
    }
    match interface.elements.iter().find(|e| &e.takes == takes) {
        Some(e) => Ok(Some(e)),
        None => {
            let offered: Vec<String> =
                interface.elements.iter().map(|e| format!("{{ {} }}", describe_takes(&e.takes))).collect();
            Err(format!(
                "{}, but interface `{}` takes {}",
                if takes.is_empty() {
                    "no `elements`".to_string()
                } else {
                    format!("`elements = {{ {declared} }}`")
                },
                interface.name,
                offered.join(", or ")
            ))
        }
    }
}

/// Makes a diagnostic of a manifest pointing at the value at a key path.
type ManifestDiag<'a> = dyn Fn(String, &[&str]) -> Diagnostic + 'a;

/// A manifest's interface and name must be those of its folders, and its version of the form
/// MAJOR.MINOR.PATCH.
fn check_manifest_identity(
    m: &ManifestFile,
    dir: &Path,
    diag: &ManifestDiag,
    problems: &mut Vec<Diagnostic>,
) {
    let folder_interface = file_name(dir.parent().unwrap_or(dir));
    if m.interface != folder_interface {
        problems.push(diag(
            format!(
                "manifest says interface `{}`, but it lives under implementations/{folder_interface}/",
                m.interface
            ),
            &["interface"],
        ));
    }
    if m.name != file_name(dir) {
        problems.push(diag(
            format!("manifest says name `{}`, but its folder is `{}`", m.name, file_name(dir)),
            &["name"],
        ));
    }
    if !is_version(&m.version) {
        problems.push(diag(
            format!("version `{}` is not of the form MAJOR.MINOR.PATCH", m.version),
            &["version"],
        ));
    }
}

/// A manifest's constraints may name only known CPU features (with the arches they belong to),
/// known arches and known shape parameters.
fn check_constraints(c: &Constraints, diag: &ManifestDiag, problems: &mut Vec<Diagnostic>) {
    for f in &c.cpu_features {
        if !cpu::X86_64_FEATURES.contains(&f.as_str()) {
            problems.push(
                diag(format!("unknown CPU feature `{f}`"), &["constraints", "cpu_features"])
                    .hint(format!("known: {}", cpu::X86_64_FEATURES.join(", "))),
            );
        }
    }
    if !c.cpu_features.is_empty() && c.arches.is_none() {
        problems.push(
            diag("CPU features are declared without `arches`".into(), &["constraints"])
                .hint("add `arches = [\"x86_64\"]`"),
        );
    }
    for a in c.arches.iter().flatten() {
        if !ARCHES.contains(&a.as_str()) {
            problems.push(
                diag(format!("unknown arch `{a}`"), &["constraints", "arches"])
                    .hint(format!("known: {}", ARCHES.join(", "))),
            );
        }
    }
    for key in c.shapes.keys() {
        if Shape::named(key).is_none() {
            let names = Shape::ALL.map(Shape::name);
            let hint = nearest(key, names.iter().copied())
                .map_or_else(|| format!("known: {}", names.join(", ")), |n| format!("did you mean `{n}`?"));
            problems.push(
                diag(format!("unknown shape parameter `{key}`"), &["constraints", "shapes", key]).hint(hint),
            );
        }
    }
}

/// The shared modules a manifest lists must exist; `packed_len` goes with `packs_weights` and
/// names a function of one of them, and `team_job` goes with the team module.
fn check_shared_uses(
    m: &ManifestFile,
    shared: &BTreeMap<String, SharedModule>,
    diag: &ManifestDiag,
    problems: &mut Vec<Diagnostic>,
) {
    for s in &m.shared {
        if !shared.contains_key(s) {
            problems.push(diag(
                format!("shared module `{s}` does not exist in implementations/{SHARED_DIR}/"),
                &["shared"],
            ));
        }
    }

    match (&m.packed_len, m.packs_weights) {
        (None, true) => {
            problems.push(diag("`packs_weights`, but no `packed_len`".into(), &["packs_weights"]).hint(
                "name the function of a shared module that gives the length of a packed `[n, k]` matrix: \
                 `packed_len = \"<module>::<function>\"`, a `pub fn (usize, usize) -> usize`",
            ))
        }
        (Some(_), false) => problems.push(
            diag("`packed_len`, but the kernel does not pack its weights".into(), &["packed_len"])
                .hint("add `packs_weights = true`, or remove `packed_len`"),
        ),
        (Some(path), true) => {
            if let Some(problem) = check_packed_len(path, &m.shared, shared) {
                problems.push(diag(problem, &["packed_len"]));
            }
        }
        (None, false) => {}
    }

    let uses_team = m.shared.iter().any(|s| s == TEAM_MODULE);
    match &m.team_job {
        None if uses_team => problems.push(
            diag(format!("uses shared module `{TEAM_MODULE}` but names no `team_job`"), &["shared"])
                .hint("add `team_job = \"<type>\"`: the type it hands to the team, a struct of kernel.rs or a shared module's"),
        ),
        Some(job) if !uses_team => problems.push(
            diag(
                format!("`team_job = \"{job}\"`, but `shared` does not list `{TEAM_MODULE}`"),
                &["team_job"],
            )
            .hint(format!("add \"{TEAM_MODULE}\" to `shared`, or remove `team_job`")),
        ),
        Some(job) if job.contains("::") => {
            if let Some(problem) = check_shared_team_job(job, m, shared) {
                problems.push(diag(problem, &["team_job"]).hint(
                    "name a type of kernel.rs (`Shared`), or a shared module's type that implements \
                     `job::Job` (`avx512_matmul::Product<W>`)",
                ));
            }
        }
        _ => {}
    }
}

/// Why `job` (a manifest's `team_job` that names a shared module's type) is not a type whose
/// path starts at a shared module the manifest lists and names a public struct or alias of
/// it, if it is not. (Its generic arguments are the compiler's to check.)
fn check_shared_team_job(
    job: &str,
    m: &ManifestFile,
    shared: &BTreeMap<String, SharedModule>,
) -> Option<String> {
    let Ok(syn::Type::Path(ty)) = syn::parse_str::<syn::Type>(job) else {
        return Some(format!("`team_job = \"{job}\"` is not a type's path"));
    };
    let mut segments = ty.path.segments.iter();
    let (Some(module), Some(name), None) = (segments.next(), segments.next(), segments.next()) else {
        return Some(format!("`team_job = \"{job}\"` is not of the form `<module>::<Type>`"));
    };
    let module = module.ident.to_string();
    if !m.shared.contains(&module) {
        return Some(format!("`team_job` names shared module `{module}`, which `shared` does not list"));
    }
    // A missing module is reported with `shared`.
    let file = rust_source::parse_with_comments(&shared.get(&module)?.source).ok()?;
    let public = file.items.iter().any(|item| match item {
        syn::Item::Struct(s) => s.ident == name.ident && matches!(s.vis, syn::Visibility::Public(_)),
        syn::Item::Type(t) => t.ident == name.ident && matches!(t.vis, syn::Visibility::Public(_)),
        _ => false,
    });
    (!public).then(|| format!("shared module `{module}` has no public struct or type `{}`", name.ident))
}

/// The kernel (`source`, at `rel_kernel`) must parse, expose exactly its interface's items
/// (and its packing functions when the manifest says it packs its weights), declare the team
/// job its manifest names and every CPU feature it enables.
fn check_kernel(
    m: &ManifestFile,
    interface: &Interface,
    types: &BTreeMap<String, String>,
    source: &Arc<str>,
    rel_kernel: &Path,
    diag: &ManifestDiag,
    problems: &mut Vec<Diagnostic>,
) {
    // A packing kernel exposes the interface's packing functions as well.
    let mut interface = interface.clone();
    if m.packs_weights {
        match std::mem::take(&mut interface.packing) {
            packing if !packing.is_empty() => interface.functions.extend(packing),
            _ => problems.push(
                diag(
                    format!("`packs_weights`, but interface `{}` declares no packing function", m.interface),
                    &["packs_weights"],
                )
                .hint("only interfaces with `[[packing]]` functions let implementations pack their weights"),
            ),
        }
    }
    match rust_source::parse_with_comments(source) {
        Ok(file) => {
            if let Some(job) = &m.team_job {
                problems.extend(check_team_job(&file, job, &m.shared, types, rel_kernel, source));
            }
            problems.extend(check_against_interface(&file, &interface, rel_kernel, source));
            problems.extend(check_target_features(&file, &m.constraints.cpu_features, rel_kernel, source));
        }
        Err(e) => problems.push(source_diag(rel_kernel, source, &e)),
    }
}

fn is_version(v: &str) -> bool {
    let parts: Vec<&str> = v.split('.').collect();
    parts.len() == 3 && parts.iter().all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// A signature in canonical form (printed by prettyplease), for comparison: trailing commas
/// and line breaks do not count, tokens do.
fn sig_key(vis: &syn::Visibility, sig: &syn::Signature) -> String {
    pretty_signature(vis, sig)
}

/// A signature as a person would write it.
pub fn pretty_signature(vis: &syn::Visibility, sig: &syn::Signature) -> String {
    let file: syn::File = syn::parse_quote!(#vis #sig {});
    let printed = prettyplease::unparse(&file);
    let flat = printed.trim().trim_end_matches("{}").split_whitespace().collect::<Vec<_>>().join(" ");
    flat.replace("< ", "<").replace("( ", "(").replace(", >", ">").replace(", )", ")")
}

fn span_offset(source: &str, span: proc_macro2::Span) -> std::ops::Range<usize> {
    let start = span.start();
    let offset = offset_of(source, start.line, start.column + 1);
    offset..offset + 1
}

/// Checks that `file` exposes exactly the interface's items, with exactly its signatures.
pub fn check_against_interface(
    file: &syn::File,
    interface: &Interface,
    rel: &Path,
    source: &Arc<str>,
) -> Vec<Diagnostic> {
    let mut problems = Vec::new();
    let mut declared: BTreeSet<String> = BTreeSet::new();
    check_interface_functions(file, interface, rel, source, &mut declared, &mut problems);
    check_interface_types(file, interface, rel, source, &mut declared, &mut problems);
    check_extra_items(file, interface, &declared, rel, source, &mut problems);
    problems
}

/// Every function the interface declares must be in `file` with exactly its signature; their
/// names are added to `declared`.
fn check_interface_functions(
    file: &syn::File,
    interface: &Interface,
    rel: &Path,
    source: &Arc<str>,
    declared: &mut BTreeSet<String>,
    problems: &mut Vec<Diagnostic>,
) {
    let here = |span: proc_macro2::Span| span_offset(source, span);
    for decl in &interface.functions {
        let expected = parse_fn_decl(&decl.signature).expect("checked when the interface loaded");
        let name = expected.sig.ident.to_string();
        declared.insert(name.clone());
        let found = file.items.iter().find_map(|item| match item {
            syn::Item::Fn(f) if f.sig.ident == name => Some(f),
            _ => None,
        });
        match found {
            None => problems.push(
                Diagnostic::new(format!("missing `{name}`, which interface `{}` requires", interface.name))
                    .at_path(rel)
                    .note(format!("expected: {}", pretty_signature(&expected.vis, &expected.sig))),
            ),
            Some(f) if sig_key(&f.vis, &f.sig) != sig_key(&expected.vis, &expected.sig) => problems.push(
                Diagnostic::new(format!(
                    "`{name}` does not match the signature that interface `{}` declares",
                    interface.name
                ))
                .in_file(rel, source)
                .primary(here(f.sig.ident.span()), "this signature differs")
                .note(format!("expected: {}", pretty_signature(&expected.vis, &expected.sig)))
                .note(format!("   found: {}", pretty_signature(&f.vis, &f.sig)))
                .hint(format!(
                    "implementations must expose exactly the signatures of {}",
                    interface.path.display()
                )),
            ),
            Some(_) => {}
        }
    }
}

/// Every type the interface declares must be in `file` with exactly its declaration and
/// methods; their names are added to `declared`.
fn check_interface_types(
    file: &syn::File,
    interface: &Interface,
    rel: &Path,
    source: &Arc<str>,
    declared: &mut BTreeSet<String>,
    problems: &mut Vec<Diagnostic>,
) {
    let here = |span: proc_macro2::Span| span_offset(source, span);
    for decl in &interface.types {
        let expected: syn::ItemStruct =
            syn::parse_str(&format!("{};", decl.declaration)).expect("checked when the interface loaded");
        let name = expected.ident.to_string();
        declared.insert(name.clone());
        let found = file.items.iter().find_map(|item| match item {
            syn::Item::Struct(s) if s.ident == name => Some(s),
            _ => None,
        });
        let header = |s: &syn::ItemStruct| {
            format!("{} struct {}{}", s.vis.to_token_stream(), s.ident, s.generics.to_token_stream())
        };
        match found {
            None => problems.push(
                Diagnostic::new(format!("missing `{name}`, which interface `{}` requires", interface.name))
                    .at_path(rel)
                    .note(format!("expected: {}", decl.declaration)),
            ),
            Some(s) if header(s) != header(&expected) => problems.push(
                Diagnostic::new(format!(
                    "`{name}` does not match the declaration of interface `{}`",
                    interface.name
                ))
                .in_file(rel, source)
                .primary(here(s.ident.span()), "this declaration differs")
                .note(format!("expected: {}", decl.declaration)),
            ),
            Some(_) => {}
        }
        check_methods(file, decl, &name, interface, rel, source, problems);
    }
}

/// The inherent methods of type `name` in `file` must be exactly those `decl` declares, with
/// exactly their signatures: none missing, and no other public.
fn check_methods(
    file: &syn::File,
    decl: &TypeDecl,
    name: &str,
    interface: &Interface,
    rel: &Path,
    source: &Arc<str>,
    problems: &mut Vec<Diagnostic>,
) {
    let here = |span: proc_macro2::Span| span_offset(source, span);
    let methods: Vec<&syn::ImplItemFn> = file
        .items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Impl(i)
                if i.trait_.is_none() && self_type_name(&i.self_ty).as_deref() == Some(name) =>
            {
                Some(i)
            }
            _ => None,
        })
        .flat_map(|i| i.items.iter())
        .filter_map(|item| match item {
            syn::ImplItem::Fn(f) => Some(f),
            _ => None,
        })
        .collect();
    let mut declared_methods = BTreeSet::new();
    for m in &decl.methods {
        let expected = parse_fn_decl(m).expect("checked when the interface loaded");
        let method = expected.sig.ident.to_string();
        declared_methods.insert(method.clone());
        match methods.iter().find(|f| f.sig.ident == method) {
            None => problems.push(
                Diagnostic::new(format!(
                    "missing method `{name}::{method}`, which interface `{}` requires",
                    interface.name
                ))
                .at_path(rel)
                .note(format!("expected: {m}")),
            ),
            Some(f) if sig_key(&f.vis, &f.sig) != sig_key(&expected.vis, &expected.sig) => problems.push(
                Diagnostic::new(format!(
                    "`{name}::{method}` does not match the signature that interface `{}` declares",
                    interface.name
                ))
                .in_file(rel, source)
                .primary(here(f.sig.ident.span()), "this signature differs")
                .note(format!("expected: {}", pretty_signature(&expected.vis, &expected.sig)))
                .note(format!("   found: {}", pretty_signature(&f.vis, &f.sig))),
            ),
            Some(_) => {}
        }
    }
    for f in &methods {
        if is_pub(&f.vis) && !declared_methods.contains(&f.sig.ident.to_string()) {
            problems.push(
                Diagnostic::new(format!(
                    "`{name}::{}` is public but not part of interface `{}`",
                    f.sig.ident, interface.name
                ))
                .in_file(rel, source)
                .primary(here(f.sig.ident.span()), "extra public method")
                .hint("make it private: an implementation exposes exactly its interface"),
            );
        }
    }
}

/// No public item of `file` may be missing from `declared`, the names the interface declares.
fn check_extra_items(
    file: &syn::File,
    interface: &Interface,
    declared: &BTreeSet<String>,
    rel: &Path,
    source: &Arc<str>,
    problems: &mut Vec<Diagnostic>,
) {
    for item in &file.items {
        let (vis, ident) = match item {
            syn::Item::Fn(f) => (&f.vis, &f.sig.ident),
            syn::Item::Struct(s) => (&s.vis, &s.ident),
            syn::Item::Enum(e) => (&e.vis, &e.ident),
            syn::Item::Const(c) => (&c.vis, &c.ident),
            syn::Item::Static(s) => (&s.vis, &s.ident),
            syn::Item::Type(t) => (&t.vis, &t.ident),
            syn::Item::Trait(t) => (&t.vis, &t.ident),
            syn::Item::Mod(m) => (&m.vis, &m.ident),
            _ => continue,
        };
        if is_pub(vis) && !declared.contains(&ident.to_string()) {
            problems.push(
                Diagnostic::new(format!("`{ident}` is public but not part of interface `{}`", interface.name))
                    .in_file(rel, source)
                    .primary(span_offset(source, ident.span()), "extra public item")
                    .hint("make it private (or move shared helpers to implementations/_shared/): an implementation exposes exactly its interface"),
            );
        }
    }
}

/// The types of kernel.rs that a kernel's team job names must be `pub(crate)` structs, enums or
/// aliases there (the generated `kernels::TeamJob` holds them): the job itself (`Shared`), or
/// the kernel's own type arguments of a shared module's type (`RoundBf16` in
/// `kv_split::Split<RoundBf16>`; a type placeholder of a kernel of one element type is one).
fn check_team_job(
    file: &syn::File,
    job: &str,
    shared: &[String],
    types: &BTreeMap<String, String>,
    rel: &Path,
    source: &Arc<str>,
) -> Vec<Diagnostic> {
    let own = match job.contains("::") {
        true => crate::manifest::team_job_own_types(job, shared, types),
        false => vec![job],
    };
    let mut problems = Vec::new();
    for ident in own {
        let found = file.items.iter().find_map(|item| match item {
            syn::Item::Struct(s) if s.ident == ident => Some((&s.vis, s.ident.span())),
            syn::Item::Enum(e) if e.ident == ident => Some((&e.vis, e.ident.span())),
            syn::Item::Type(t) if t.ident == ident => Some((&t.vis, t.ident.span())),
            _ => None,
        });
        let named = match ident == job {
            true => format!("team job `{job}`"),
            false => format!("`{ident}`, which team job `{job}` names,"),
        };
        match found {
            Some((syn::Visibility::Restricted(r), _)) if r.path.is_ident("crate") => {}
            Some((_, span)) => problems.push(
                Diagnostic::new(format!("{named} must be `pub(crate)`"))
                    .in_file(rel, source)
                    .primary(span_offset(source, span), "declared here")
                    .hint("the crate's `kernels::TeamJob` holds it, and the team's `run` is `pub(crate)`"),
            ),
            None => problems.push(
                Diagnostic::new(format!("{named} is not a struct, enum or type alias of {}", rel.display()))
                    .hint("`team_job` names the type that the kernel hands to `team::run`: a type of kernel.rs, or a shared module's type whose arguments are shared modules' types, the element type's placeholders, or types of kernel.rs"),
            ),
        }
    }
    problems
}

fn is_pub(vis: &syn::Visibility) -> bool {
    matches!(vis, syn::Visibility::Public(_))
}

fn self_type_name(ty: &syn::Type) -> Option<String> {
    match ty {
        syn::Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        _ => None,
    }
}

/// Every CPU feature the functions of `file` enable with `#[target_feature(enable = "...")]`,
/// with the span of the string that names it, in order of appearance.
fn enabled_features(file: &syn::File) -> Vec<(String, proc_macro2::Span)> {
    struct Visitor(Vec<(String, proc_macro2::Span)>);
    impl<'ast> syn::visit::Visit<'ast> for Visitor {
        fn visit_attribute(&mut self, attr: &'ast syn::Attribute) {
            if attr.path().is_ident("target_feature") {
                let _ = attr.parse_nested_meta(|meta| {
                    if meta.path.is_ident("enable") {
                        let lit: syn::LitStr = meta.value()?.parse()?;
                        for feature in lit.value().split(',').map(str::trim) {
                            self.0.push((feature.to_string(), lit.span()));
                        }
                    }
                    Ok(())
                });
            }
            syn::visit::visit_attribute(self, attr);
        }
    }
    let mut v = Visitor(Vec::new());
    syn::visit::Visit::visit_file(&mut v, file);
    v.0
}

/// Every feature a kernel enables with `#[target_feature(enable = "...")]` must be declared.
fn check_target_features(
    file: &syn::File,
    declared: &[String],
    rel: &Path,
    source: &Arc<str>,
) -> Vec<Diagnostic> {
    enabled_features(file)
        .into_iter()
        .filter(|(feature, _)| !declared.contains(feature))
        .map(|(feature, span)| {
            Diagnostic::new(format!("the kernel enables CPU feature `{feature}`, which its manifest does not declare"))
                .in_file(rel, source)
                .primary(span_offset(source, span), "enabled here")
                .hint(format!("add \"{feature}\" to constraints.cpu_features in manifest.toml, so that resolution and the start-up check know about it"))
        })
        .collect()
}

/// Names of implementations that take part in a cycle of `shadows` (A shadows B shadows A):
/// with both compatible, neither could be chosen.
fn shadow_cycles(imps: &[Implementation]) -> Vec<String> {
    let shadows = |name: &str| imps.iter().find(|i| i.name == name).map_or(&[][..], |i| i.shadows.as_slice());
    let mut in_cycle: Vec<String> = Vec::new();
    for start in imps {
        if in_cycle.contains(&start.name) {
            continue;
        }
        let mut seen = BTreeSet::new();
        let mut frontier: Vec<&str> = start.shadows.iter().map(String::as_str).collect();
        while let Some(name) = frontier.pop() {
            if name == start.name {
                in_cycle.push(start.name.clone());
                break;
            }
            if seen.insert(name) {
                frontier.extend(shadows(name).iter().map(String::as_str));
            }
        }
    }
    in_cycle
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matmul_interface() -> Interface {
        Interface {
            name: "matmul".into(),
            summary: String::new(),
            description: String::new(),
            reference: Some("scalar".into()),
            elements: Vec::new(),
            functions: vec![FnDecl {
                signature: "pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[f32], rows: usize)".into(),
                doc: String::new(),
                elements: None,
                device: None,
            }],
            types: vec![],
            packing: Vec::new(),
            path: "interfaces/matmul.toml".into(),
        }
    }

    fn check(src: &str) -> Vec<String> {
        let source: Arc<str> = Arc::from(src);
        let file = rust_source::parse_with_comments(src).unwrap();
        check_against_interface(&file, &matmul_interface(), Path::new("kernel.rs"), &source)
            .iter()
            .map(|d| d.render())
            .collect()
    }

    #[test]
    fn a_device_sees_its_own_functions_and_the_host_ones_where_it_declares_none() {
        let mut interface = matmul_interface();
        let cuda = "pub fn matmul<const N: usize, const K: usize>(gpu: &Gpu, out: &mut CudaSlice<f32>, x: &CudaSlice<f32>, w: &CudaSlice<f32>, rows: usize) -> Result<(), GpuError>";
        let cpu = interface.functions[0].signature.clone();
        assert_eq!(
            interface.for_device(Device::Cuda).functions[0].signature,
            cpu,
            "no CUDA functions: host code"
        );
        interface.functions.push(FnDecl {
            signature: cuda.into(),
            doc: String::new(),
            elements: None,
            device: Some(Device::Cuda),
        });
        let on =
            |d| interface.for_device(d).functions.iter().map(|f| f.signature.clone()).collect::<Vec<_>>();
        assert_eq!(on(Device::Cuda), [cuda]);
        assert_eq!(on(Device::Cpu), [cpu]);
        // A CUDA kernel is checked against the CUDA signature.
        let source: Arc<str> = format!("{cuda} {{ Ok(()) }}\n").into();
        let file = syn::parse_file(&source).unwrap();
        let check = |d| check_against_interface(&file, &interface.for_device(d), Path::new("k.rs"), &source);
        assert!(check(Device::Cuda).is_empty());
        assert!(!check(Device::Cpu).is_empty());
    }

    #[test]
    fn exact_signature_passes() {
        let errors = check(
            "pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[f32], rows: usize) {}\nfn helper() {}\n",
        );
        assert!(errors.is_empty(), "{errors:?}");
    }

    #[test]
    fn wrong_signature_is_rejected_with_both_forms() {
        let errors =
            check("\npub fn matmul<const N: usize>(out: &mut [f32], x: &[f32], w: &[f32], rows: usize) {}\n");
        assert_eq!(errors.len(), 1);
        let e = &errors[0];
        assert!(e.contains("`matmul` does not match the signature that interface `matmul` declares"), "{e}");
        assert!(e.contains("kernel.rs:2:8"), "{e}");
        assert!(e.contains("expected: pub fn matmul<const N: usize, const K: usize>("), "{e}");
        assert!(e.contains("found: pub fn matmul<const N: usize>("), "{e}");
    }

    #[test]
    fn missing_unsafe_or_private_items_are_rejected() {
        assert!(check("fn other() {}\n")[0].contains("missing `matmul`"));
        let e = check(
            "pub unsafe fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[f32], rows: usize) {}\n",
        );
        assert!(e[0].contains("does not match"), "{e:?}");
        let e = check(
            "fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[f32], rows: usize) {}\n",
        );
        assert!(e[0].contains("does not match"), "{e:?}");
        let e = check(
            "pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[f32], rows: usize) {}\npub fn extra() {}\n",
        );
        assert!(e[0].contains("`extra` is public but not part of interface `matmul`"), "{e:?}");
    }

    #[test]
    fn undeclared_target_features_are_rejected() {
        let src = "#[target_feature(enable = \"avx2,fma\")]\nfn k() {}\n";
        let source: Arc<str> = Arc::from(src);
        let file = rust_source::parse_with_comments(src).unwrap();
        let e = check_target_features(&file, &["avx2".to_string()], Path::new("kernel.rs"), &source);
        assert_eq!(e.len(), 1);
        assert!(e[0].message.contains("`fma`"));
    }

    /// A matmul with two element types, the second with a function of its own.
    fn typed_interface() -> Interface {
        let element = |name: &str, weights: &str, w: &str| Element {
            name: name.into(),
            summary: String::new(),
            takes: BTreeMap::from([("weights".to_string(), weights.to_string())]),
            reference: format!("{name}-scalar"),
            types: BTreeMap::from([("weights".to_string(), w.to_string())]),
        };
        let decl = |signature: &str, elements: Option<Vec<String>>| FnDecl {
            signature: signature.into(),
            doc: String::new(),
            elements,
            device: None,
        };
        Interface {
            elements: vec![element("f32", "f32", "w: &[f32]"), element("q8", "int8", "w: (&[i8], &[f32])")],
            reference: None,
            functions: vec![decl("pub fn matmul(out: &mut [f32], {weights})", None)],
            packing: vec![decl("pub fn check_packed(packed: &[i8]) -> bool", Some(vec!["q8".into()]))],
            ..matmul_interface()
        }
    }

    #[test]
    fn an_element_type_fills_the_signatures_and_picks_its_functions() {
        let interface = typed_interface();
        assert!(check_interface(&interface).is_empty());
        let types = BTreeMap::from([("weights", "int8"), ("activations", "f32")]);
        let q8 = interface.element_for(&types).unwrap();
        assert_eq!(q8.map(|e| e.name.as_str()), Some("q8"));
        assert_eq!(interface.reference_of(q8), "q8-scalar");
        let at = interface.at(q8);
        assert_eq!(at.functions[0].signature, "pub fn matmul(out: &mut [f32], w: (&[i8], &[f32]))");
        assert_eq!(at.name, "matmul<q8>");
        assert_eq!(at.packing.len(), 1);
        let f32 = interface.at(interface.elements.first());
        assert_eq!(f32.functions[0].signature, "pub fn matmul(out: &mut [f32], w: &[f32])");
        assert!(f32.packing.is_empty(), "check_packed is q8's alone");
        // Weights no element type takes: the error says which it takes.
        let why = interface.element_for(&BTreeMap::from([("weights", "bf16"), ("kv", "f32")])).unwrap_err();
        assert_eq!(
            why,
            "interface `matmul` takes { weights = f32 }, or { weights = int8 }; the workload has weights = bf16"
        );
        // An interface without element types has none to pick.
        assert!(matmul_interface().element_for(&types).unwrap().is_none());
    }

    #[test]
    fn interface_files_with_element_types_are_checked() {
        let both = Interface { reference: Some("scalar".into()), ..typed_interface() };
        assert!(check_interface(&both)[0].message.contains("names a `reference` and `[[elements]]`"));
        let mut twice = typed_interface();
        twice.elements[1].name = "f32".into();
        assert!(
            check_interface(&twice).iter().any(|d| d.message.contains("declares element type `f32` twice"))
        );
        let mut unknown = typed_interface();
        unknown.packing[0].elements = Some(vec!["int4".into()]);
        assert!(
            check_interface(&unknown)
                .iter()
                .any(|d| d.message.contains("is limited to element type `int4`, which it does not declare"))
        );
        let mut unfilled = typed_interface();
        unfilled.elements[0].types.clear();
        let found = check_interface(&unfilled);
        assert!(
            found.iter().any(|d| d.message.contains("interface `matmul<f32>`: signature does not parse")),
            "{found:?}"
        );
        let mut stray = typed_interface();
        stray.elements[1].takes.insert("dtype".into(), "int8".into());
        assert!(
            check_interface(&stray)
                .iter()
                .any(|d| d.message.contains("takes `dtype`, which no workload has"))
        );
        let mut within = typed_interface();
        within.elements[1].takes = BTreeMap::from([
            ("weights".to_string(), "f32".to_string()),
            ("kv".to_string(), "bf16".to_string()),
        ]);
        assert!(
            check_interface(&within)
                .iter()
                .any(|d| d.message.contains("a workload that fits element type `q8`")),
            "{:?}",
            check_interface(&within)
        );
        let mut empty = typed_interface();
        empty.elements[0].takes.clear();
        assert!(
            check_interface(&empty).iter().any(|d| d.message.contains("element type `f32` takes nothing"))
        );
    }

    #[test]
    fn a_folder_of_several_element_types_is_an_entry_for_each() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let registry = Registry::load(&root).unwrap();
        let entries: Vec<&Implementation> = registry
            .implementations_of("attention_decode")
            .iter()
            .filter(|i| i.name == "avx512-threads")
            .collect();
        let elements: Vec<Option<&str>> = entries.iter().map(|i| i.element.as_deref()).collect();
        assert_eq!(elements, [Some("f32"), Some("bf16")]);
        let (f32, bf16) = (entries[0], entries[1]);
        assert!(f32.several_elements && bf16.several_elements);
        // Each compiles the kernel with its placeholder made a type alias, after the module's
        // documentation, and needs the CPU features of its own element type.
        assert!(
            f32.source.contains("\npub type KV = f32;\n") && bf16.source.contains("\npub type KV = u16;\n")
        );
        assert!(bf16.source.starts_with("//! "));
        let alias = bf16.source.find("pub type KV").unwrap();
        assert!(!bf16.source[alias..].contains("//!"), "the alias goes after the module's documentation");
        assert_eq!(f32.constraints.cpu_features, ["avx512f"]);
        assert_eq!(bf16.constraints.cpu_features, ["avx512f", "avx512bw", "avx512vl"]);
        assert_eq!(f32.source_sha256, bf16.source_sha256, "one kernel.rs");
        // Lookups name the element type; both element types' reference is the one folder.
        assert_eq!(
            registry.implementation("attention_decode", "scalar", Some("bf16")).unwrap().element.as_deref(),
            Some("bf16")
        );
        let interface = &registry.interfaces["attention_decode"];
        assert!(interface.elements.iter().all(|e| e.reference == "scalar"));
    }

    /// The problems `load_implementation` finds in a folder `name` of `interface` with this
    /// manifest (its `elements` and `[constraints]` tail) and kernel.
    fn load_problems(interface: &str, elements: &str, constraints: &str, kernel: &str) -> Vec<String> {
        load_problems_with(|_| {}, interface, elements, constraints, kernel)
    }

    /// [`load_problems`] against the project's interfaces as `edit` leaves them.
    fn load_problems_with(
        edit: impl FnOnce(&mut BTreeMap<String, Interface>),
        interface: &str,
        elements: &str,
        constraints: &str,
        kernel: &str,
    ) -> Vec<String> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut registry = Registry::load(&root).unwrap();
        edit(&mut registry.interfaces);
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path().join("implementations").join(interface).join("x");
        std::fs::create_dir_all(&dir).unwrap();
        let manifest = format!(
            "interface = \"{interface}\"\nname = \"x\"\nversion = \"1.0.0\"\nsummary = \"s\"\npriority = 1\n\
             elements = {elements}\n\n[constraints]\n{constraints}"
        );
        std::fs::write(dir.join("manifest.toml"), manifest).unwrap();
        std::fs::write(dir.join(KERNEL_FILE), kernel).unwrap();
        let mut problems = Vec::new();
        let loaded =
            load_implementation(temp.path(), &dir, &registry.interfaces, &registry.shared, &mut problems);
        assert_eq!(loaded.is_none(), !problems.is_empty());
        problems.iter().map(|d| d.render()).collect()
    }

    #[test]
    fn several_element_types_need_one_signature_and_say_so() {
        let decode = "pub fn attention_decode<const N_HEADS: usize, const N_KV_HEADS: usize, const HEAD_DIM: usize>(out: &mut [f32], q: &[f32], keys: &[KV], values: &[KV], scores: &mut [f32]) {}\n";
        let both = r#"[{ kv = "f32" }, { kv = "bf16" }]"#;
        assert_eq!(load_problems("attention_decode", both, "", decode), Vec::<String>::new());
        // Written with one element type's own types, the kernel does not match the other's.
        let u16_kernel = decode.replace("[KV]", "[u16]");
        let problems = load_problems("attention_decode", both, "", &u16_kernel);
        assert!(problems[0].contains("keys: &[KV]"), "{problems:?}");
        // matmul's `{weights}` are parameters, `w: &[{W}]`: the same at f32 and bf16, whose
        // kernel names `W`; int8's are a pair with the scales, so one of its kernels is a folder
        // of its own.
        let matmul = "pub fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &[W], rows: usize) {}\n";
        let f32_and = |other: &str| {
            format!(
                r#"[{{ weights = "f32", activations = "f32" }}, {{ weights = "{other}", activations = "f32" }}]"#
            )
        };
        assert_eq!(load_problems("matmul", &f32_and("bf16"), "", matmul), Vec::<String>::new());
        let problems = load_problems("matmul", &f32_and("int8"), "", matmul);
        assert!(
            problems.iter().any(|p| p.contains(
                "`{weights}` differs between them: `w: &[W]` at `f32`, `w: (&[W], &[f32])` at `q8`"
            )),
            "{problems:?}"
        );
        let twice = load_problems("attention_decode", r#"[{ kv = "f32" }, { kv = "f32" }]"#, "", decode);
        assert!(twice.iter().any(|p| p.contains("lists element type `f32` twice")), "{twice:?}");
        // A capital placeholder stands for a type, which the kernel names: one that does not
        // parse as a type cannot be an alias.
        let not_a_type = load_problems_with(
            |interfaces| {
                let decode = interfaces.get_mut("attention_decode").unwrap();
                decode.elements[1].types.insert("KV".into(), "u16 bits".into());
            },
            "attention_decode",
            both,
            "",
            decode,
        );
        assert!(
            not_a_type.iter().any(|p| p
                .contains("`{KV}` of `attention_decode<bf16>` stands for `u16 bits`, which is not a type")),
            "{not_a_type:?}"
        );
        // Features of one element type need several element types.
        let single = load_problems(
            "attention_decode",
            r#"{ kv = "bf16" }"#,
            "arches = [\"x86_64\"]\n[constraints.element_cpu_features]\nbf16 = [\"avx2\"]\n",
            &decode.replace("[KV]", "[u16]"),
        );
        assert!(single.iter().any(|p| p.contains("but `elements` names one element type")), "{single:?}");
        let one = load_problems("attention_decode", r#"[{ kv = "f32" }]"#, "", decode);
        assert!(one.iter().any(|p| p.contains("fewer than two")), "{one:?}");
        let stray = load_problems(
            "attention_decode",
            both,
            "arches = [\"x86_64\"]\n[constraints.element_cpu_features]\nint8 = [\"avx2\"]\n",
            decode,
        );
        assert!(
            stray.iter().any(|p| p.contains("names `int8`, which is not an element type it takes")),
            "{stray:?}"
        );
    }

    #[test]
    fn shadow_cycles_are_found() {
        let imp = |name: &str, shadows: &[&str]| Implementation {
            shadows: shadows.iter().map(|s| s.to_string()).collect(),
            ..Implementation::for_tests("matmul", name)
        };
        assert!(shadow_cycles(&[imp("a", &["b"]), imp("b", &[])]).is_empty());
        assert_eq!(shadow_cycles(&[imp("a", &["b"]), imp("b", &["c"]), imp("c", &["a"])]), ["a", "b", "c"]);
        // A folder of several element types is an entry per type, named once in a cycle.
        let twice = [imp("a", &["b"]), imp("a", &["b"]), imp("b", &["a"])];
        assert_eq!(shadow_cycles(&twice), ["a", "b"]);
    }

    #[test]
    fn shape_bounds_explain_violations() {
        let b = ShapeBound { min: Some(2), max: Some(64), multiple_of: Some(8) };
        assert_eq!(b.violation(16), None);
        assert_eq!(b.violation(1).unwrap(), "is 1, below the minimum 2");
        assert_eq!(b.violation(128).unwrap(), "is 128, above the maximum 64");
        assert_eq!(b.violation(12).unwrap(), "is 12, not a multiple of 8");
    }
}
