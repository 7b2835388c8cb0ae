//! Compiles every implementation in `implementations/` into this crate.
//!
//! Scans `implementations/<interface>/<name>/manifest.toml` and writes three files into
//! OUT_DIR:
//! - `kernels.rs`: `pub mod kernels`, with the helper modules of `implementations/_shared/`
//!   in `kernels::shared` and every implementation as `kernels::<interface>__<name>` (dashes
//!   become underscores; `__<element type>` added for a folder of several, compiled once for
//!   each with its type aliases), so that a kernel's `super::shared::...` resolves as it does in a
//!   generated crate;
//! - `implementations.rs`: a `for_each_<family>!` macro per family that lists its
//!   implementations, the reference first, for the benchmark;
//! - `conformance.rs`: one `#[test]` per implementation that runs its family's conformance
//!   check (`conform_<family>!`) against the family's reference; a family whose reference is
//!   its only implementation (a new slot) may have no check yet, and gets no test.
//!
//! A family is an interface without element types (`rmsnorm`), or one element type of an
//! interface that has them (`matmul_bf16`, the implementations of `matmul` whose manifests
//! declare the types of its element type `bf16`): each element type is checked against its
//! own reference, with inputs of its own types.
//!
//! Code for another architecture is compiled only on that architecture; an implementation
//! whose CPU features the host lacks is skipped at run time, saying so.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// The fields of `interfaces/<name>.toml` this crate needs.
#[derive(Deserialize)]
struct InterfaceFile {
    name: String,
    reference: Option<String>,
    #[serde(default)]
    elements: Vec<ElementFile>,
}

/// The fields of an interface's `[[elements]]` this crate needs.
#[derive(Deserialize)]
struct ElementFile {
    name: String,
    takes: BTreeMap<String, String>,
    reference: String,
    #[serde(default)]
    types: BTreeMap<String, String>,
}

/// An element type: its name, the types it takes (`weights = "bf16"`, ...), and the Rust its
/// placeholders stand for (`KV = "u16"`).
type Element = (String, BTreeMap<String, String>, BTreeMap<String, String>);

/// What the interfaces say of their families: family → reference, and interface → its element
/// types.
struct Families {
    references: BTreeMap<String, String>,
    elements: BTreeMap<String, Vec<Element>>,
}

impl Families {
    /// The family of an implementation of `interface` that takes `takes`, with the element
    /// type (`None` for an interface without element types).
    fn of(
        &self,
        interface: &str,
        takes: &BTreeMap<String, String>,
        where_: &str,
    ) -> (String, Option<&Element>) {
        match self.elements.get(interface) {
            None => {
                assert!(
                    takes.is_empty(),
                    "{where_}: `elements`, but interface {interface} has no element types"
                );
                (interface.to_string(), None)
            }
            Some(elements) => {
                let element = elements
                    .iter()
                    .find(|(_, t, _)| t == takes)
                    .unwrap_or_else(|| panic!("{where_}: `elements` are none of interface {interface}'s"));
                (format!("{interface}_{}", element.0), Some(element))
            }
        }
    }
}

/// `manifest.toml`, with the generator's own schema, so that a manifest the generator would
/// reject fails this build too.
#[path = "../../generator/src/manifest.rs"]
#[allow(dead_code)]
mod manifest;

use manifest::Manifest;

/// One implementation, as this crate compiles it.
#[derive(Clone)]
struct Implementation {
    interface: String,
    /// The interface, or its element type that the implementation takes (`matmul_bf16`).
    family: String,
    name: String,
    kernel: PathBuf,
    /// `<interface>__<name>`, dashes as underscores (`__<element type>` added for a folder of
    /// several).
    module: String,
    /// `<interface>/<name>`, with ` at <element type>` for a folder of several.
    label: String,
    arches: Option<Vec<String>>,
    cpu_features: Vec<String>,
    shared: Vec<String>,
    /// Whether its kernel reads weights rewritten by its `pack`.
    packs_weights: bool,
    /// The shared module's function (`module::function`) that gives the length of what `pack`
    /// returns.
    packed_len: Option<String>,
    /// The type in which it hands work to the thread team (`shared/team.rs`), as a path from
    /// `kernels` (`manifest::team_job_path`).
    team_job: Option<String>,
}

impl Implementation {
    /// `#[cfg(...)]` limiting code to the implementation's arches, if it has any.
    fn arch_cfg(&self) -> Option<String> {
        arch_cfg(self.arches.as_deref())
    }

    /// An expression that is true when this CPU has the implementation's features.
    fn available(&self, krate: &str) -> String {
        if self.cpu_features.is_empty() {
            "true".to_string()
        } else {
            let features: Vec<String> = self.cpu_features.iter().map(|f| format!("{f:?}")).collect();
            format!("{krate}::cpu_has!({})", features.join(", "))
        }
    }
}

fn main() {
    let manifest_dir =
        PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let root = manifest_dir.join("../..").canonicalize().expect("the project root exists");
    let interfaces_dir = root.join("interfaces");
    let implementations_dir = root.join("implementations");
    let shared_dir = implementations_dir.join("_shared");
    for dir in [&interfaces_dir, &implementations_dir, &shared_dir] {
        println!("cargo::rerun-if-changed={}", dir.display());
    }

    let families = read_interfaces(&interfaces_dir);
    let shared_modules = read_shared_modules(&shared_dir);
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let implementations = read_implementations(&implementations_dir, &families, &shared_modules, &out_dir);
    let references = &families.references;
    for (family, reference) in references {
        let found = implementations.iter().any(|i| &i.family == family && &i.name == reference);
        assert!(
            found,
            "family `{family}` names `{reference}` as its reference, which does not exist or takes other types"
        );
    }

    write(&out_dir.join("kernels.rs"), &kernels_module(&implementations, &shared_modules));
    write(&out_dir.join("implementations.rs"), &for_each_macros(&implementations, references));
    // The families whose conformance check (`conform_<family>!`) the crate defines. A family
    // whose reference is its only implementation (a new slot) needs none yet: there is nothing
    // to compare. Its second implementation needs one.
    let sources = ["src/check.rs", "src/encoder.rs"].map(|f| {
        println!("cargo::rerun-if-changed={}", manifest_dir.join(f).display());
        fs::read_to_string(manifest_dir.join(f)).expect("the crate's check sources read")
    });
    let checked: BTreeSet<&String> = references
        .keys()
        .filter(|family| sources.iter().any(|s| s.contains(&format!("macro_rules! conform_{family} "))))
        .collect();
    for family in references.keys().filter(|f| !checked.contains(f)) {
        let others: Vec<&str> = implementations
            .iter()
            .filter(|i| &i.family == family && i.name != references[family])
            .map(|i| i.label.as_str())
            .collect();
        assert!(
            others.is_empty(),
            "{} compete with the reference of `{family}`, but tests/kernels/src/check.rs (or encoder.rs) has no `conform_{family}!` to check them against it: add it",
            others.join(", ")
        );
    }
    let tested: Vec<Implementation> =
        implementations.iter().filter(|i| checked.contains(&i.family)).cloned().collect();
    write(&out_dir.join("conformance.rs"), &conformance_tests(&tested, references));
}

/// Every family of the interfaces, with its reference.
fn read_interfaces(dir: &Path) -> Families {
    let mut families = Families { references: BTreeMap::new(), elements: BTreeMap::new() };
    for path in sorted_entries(dir) {
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let file: InterfaceFile = parse_toml(&path);
        let stem = path.file_stem().unwrap_or_default().to_string_lossy();
        assert_eq!(file.name, stem, "{}: the name differs from the file name", path.display());
        if file.elements.is_empty() {
            let reference = file.reference.unwrap_or_else(|| panic!("{}: no reference", path.display()));
            let twice = families.references.insert(file.name.clone(), reference);
            assert!(twice.is_none(), "family {} is an interface and an element type", file.name);
        } else {
            for e in &file.elements {
                let family = format!("{}_{}", file.name, e.name);
                let twice = families.references.insert(family.clone(), e.reference.clone());
                assert!(twice.is_none(), "family {family} is an interface and an element type");
            }
            let elements = file.elements.into_iter().map(|e| (e.name, e.takes, e.types)).collect();
            families.elements.insert(file.name, elements);
        }
    }
    families
}

/// Module name → path of every `implementations/_shared/<module>.rs`.
fn read_shared_modules(dir: &Path) -> BTreeMap<String, PathBuf> {
    let mut modules = BTreeMap::new();
    if !dir.is_dir() {
        return modules;
    }
    for path in sorted_entries(dir) {
        if path.extension().is_some_and(|e| e == "rs") {
            let name = path.file_stem().unwrap_or_default().to_string_lossy().into_owned();
            modules.insert(name, path);
        }
    }
    modules
}

fn read_implementations(
    dir: &Path,
    families: &Families,
    shared_modules: &BTreeMap<String, PathBuf>,
    out_dir: &Path,
) -> Vec<Implementation> {
    let mut implementations = Vec::new();
    for interface_dir in sorted_entries(dir).into_iter().filter(|p| p.is_dir()) {
        let interface = file_name(&interface_dir);
        if interface == "_shared" {
            continue;
        }
        assert!(
            families.references.contains_key(&interface) || families.elements.contains_key(&interface),
            "implementations/{interface} names no interface in interfaces/"
        );
        for impl_dir in sorted_entries(&interface_dir).into_iter().filter(|p| p.is_dir()) {
            println!("cargo::rerun-if-changed={}", impl_dir.display());
            let manifest: Manifest = parse_toml(&impl_dir.join("manifest.toml"));
            let where_ = impl_dir.display();
            assert_eq!(manifest.interface, interface, "{where_}: manifest interface differs from the folder");
            assert_eq!(
                manifest.name,
                file_name(&impl_dir),
                "{where_}: manifest name differs from the folder"
            );
            // A CUDA kernel launches on a GPU, which these tests have none of: CI compiles its
            // CUDA C with NVRTC (tests/tests/cuda.rs), and the device check runs it against the
            // references (bench/gpu_check.sh).
            if manifest.constraints.devices.as_deref() == Some(&["cuda".to_string()][..]) {
                continue;
            }
            for module in &manifest.shared {
                assert!(
                    shared_modules.contains_key(module),
                    "{where_}: shared module `{module}` is not in implementations/_shared/"
                );
            }
            for krate in &manifest.dependencies {
                assert!(
                    own_dependencies().contains(krate),
                    "{where_}: the kernel uses crate `{krate}`; add it to [dependencies] in tests/kernels/Cargo.toml"
                );
            }
            let kernel = impl_dir.join("kernel.rs");
            assert!(kernel.is_file(), "{where_}: kernel.rs is missing");
            // A kernel of several element types is compiled once for each, as a generated
            // crate compiles it: with its placeholders made type aliases.
            for takes in manifest.elements.each() {
                let (family, element) = families.of(&interface, takes, &where_.to_string());
                let mut module = format!("{interface}__{}", manifest.name.replace('-', "_"));
                let mut label = format!("{interface}/{}", manifest.name);
                let mut kernel = kernel.clone();
                let mut cpu_features = manifest.constraints.cpu_features.clone();
                let mut types = BTreeMap::new();
                if let (true, Some((name, _, element_types))) = (manifest.elements.several(), element) {
                    types = element_types.clone();
                    module = format!("{module}__{name}");
                    label = format!("{label} at {name}");
                    let source = fs::read_to_string(&kernel).expect("kernel.rs reads");
                    kernel = out_dir.join("kernels").join(format!("{module}.rs"));
                    write(&kernel, &manifest::kernel_at_element(&source, name, &types));
                    let extra = manifest.constraints.element_cpu_features.get(name);
                    cpu_features.extend(extra.into_iter().flatten().cloned());
                }
                let team_job = manifest
                    .team_job
                    .as_ref()
                    .map(|job| manifest::team_job_path(job, &module, &manifest.shared, &types));
                implementations.push(Implementation {
                    module,
                    label,
                    family,
                    interface: interface.clone(),
                    name: manifest.name.clone(),
                    kernel,
                    arches: manifest.constraints.arches.clone(),
                    cpu_features,
                    shared: manifest.shared.clone(),
                    packs_weights: manifest.packs_weights,
                    packed_len: manifest.packed_len.clone(),
                    team_job,
                });
            }
        }
    }
    implementations
}

fn kernels_module(implementations: &[Implementation], shared_modules: &BTreeMap<String, PathBuf>) -> String {
    let mut out = String::new();
    out.push_str(
        "/// Every implementation of `implementations/`, as `<interface>__<name>[__<element type>]`.\n",
    );
    // A generated crate's kernels are private to it; public here, where they are tested,
    // clippy would ask each `#[target_feature]` function for a `# Safety` section.
    out.push_str("#[allow(clippy::missing_safety_doc)]\n");
    out.push_str("pub mod kernels {\n");
    out.push_str("    /// The helper modules of `implementations/_shared/`.\n");
    out.push_str("    pub mod shared {\n");
    let team_jobs = implementations.iter().any(|i| i.team_job.is_some());
    for (module, path) in shared_modules {
        // The team runs the `TeamJob` enum, which exists only when some kernel has a job.
        if module == "team" && !team_jobs {
            continue;
        }
        if let Some(cfg) = arch_cfg(users_arches(implementations, module).as_deref()) {
            writeln!(out, "        {cfg}").unwrap();
        }
        writeln!(out, "        #[path = {:?}]", path.display().to_string()).unwrap();
        writeln!(out, "        pub mod {module};").unwrap();
    }
    out.push_str("    }\n");
    for imp in implementations {
        writeln!(out, "    /// `{}/{}`", imp.interface, imp.name).unwrap();
        if let Some(cfg) = imp.arch_cfg() {
            writeln!(out, "    {cfg}").unwrap();
        }
        out.push_str("    #[allow(non_snake_case)]\n");
        writeln!(out, "    #[path = {:?}]", imp.kernel.display().to_string()).unwrap();
        writeln!(out, "    pub mod {};", imp.module).unwrap();
    }
    out.push_str(&team_job_enum(implementations));
    out.push_str("}\n\n");
    // The weights of every matmul in the layout its kernel reads, as a generated crate loads
    // them: packed by the kernel's `pack`, or as they are.
    // (interface, parameters, return type, `pack`'s arguments, what the kernel reads of what
    // `pack` returned, the unpacked copy)
    let layouts = [
        ("matmul_f32", "w: &[f32]", "Vec<f32>", "w", "packed", "w.to_vec()"),
        ("matmul_bf16", "w: &[u16]", "Vec<u16>", "w", "packed", "w.to_vec()"),
        ("matmul_bf16act", "w: &[u16]", "Vec<u16>", "w", "packed", "w.to_vec()"),
        // A packing int8 kernel holds the scales among its bytes: its pair's scales are empty.
        (
            "matmul_q8",
            "(w, scales): (&[i8], &[f32])",
            "(Vec<i8>, Vec<f32>)",
            "(w, scales)",
            "(packed, Vec::new())",
            "(w.to_vec(), scales.to_vec())",
        ),
        (
            "matmul_q4",
            "(w, scales): (&[u8], &[u16])",
            "(Vec<u8>, Vec<u16>)",
            "(w, scales)",
            "(packed, Vec::new())",
            "(w.to_vec(), scales.to_vec())",
        ),
    ];
    for (family, params, ret, args, read, copy) in layouts {
        writeln!(out, "/// `[n, k]` weights in the layout each `{family}` implementation reads.").unwrap();
        writeln!(out, "pub mod {family}_weights {{").unwrap();
        for imp in implementations.iter().filter(|i| i.family == family) {
            if let Some(cfg) = imp.arch_cfg() {
                writeln!(out, "    {cfg}").unwrap();
            }
            out.push_str("    #[allow(non_snake_case, unused_variables)]\n");
            let m = &imp.module;
            if imp.packs_weights {
                // Every test of a packing kernel also checks that its `packed_len` (which a
                // generated crate checks a saved model's packed matrices against) agrees.
                let packed_len = imp.packed_len.as_deref().expect("a packing kernel names its `packed_len`");
                writeln!(
                    out,
                    "    pub fn {m}({params}, n: usize, k: usize) -> {ret} {{\n        let packed = super::kernels::{m}::pack({args}, n, k);\n        assert_eq!(packed.len(), super::kernels::shared::{packed_len}(n, k), \"{m}: `pack` and `{packed_len}` disagree at {{n}} x {{k}}\");\n        {read}\n    }}"
                )
                .unwrap();
            } else {
                writeln!(out, "    pub fn {m}({params}, n: usize, k: usize) -> {ret} {{ {copy} }}").unwrap();
            }
        }
        out.push_str("}\n");
    }
    out
}

/// The arches where shared module `module` compiles: wherever one of its users does (`None`:
/// everywhere, as for an unused module).
fn users_arches(implementations: &[Implementation], module: &str) -> Option<Vec<String>> {
    let users: Vec<&Implementation> =
        implementations.iter().filter(|i| i.shared.iter().any(|s| s == module)).collect();
    if users.iter().any(|i| i.arches.is_none()) || users.is_empty() {
        return None;
    }
    let union: BTreeSet<String> = users.iter().flat_map(|i| i.arches.iter().flatten().cloned()).collect();
    Some(union.into_iter().collect())
}

/// `kernels::TeamJob`, as monogen writes it into a crate, over every implementation that hands
/// work to the thread team: the team's workers run it.
fn team_job_enum(implementations: &[Implementation]) -> String {
    // Kernels that hand the team the same type (a shared module's work at one element type)
    // share its variant, as in a generated crate, named after the first of them and compiled
    // wherever one of them is.
    let key = |job: &str| job.replace(' ', "");
    let mut jobs: Vec<(&Implementation, &str, Option<String>)> = Vec::new();
    for imp in implementations {
        let Some(job) = imp.team_job.as_deref() else { continue };
        if jobs.iter().any(|(_, other, _)| key(other) == key(job)) {
            continue;
        }
        let sharers =
            implementations.iter().filter(|i| i.team_job.as_deref().is_some_and(|j| key(j) == key(job)));
        // Every arch where one of them compiles; none (everywhere) where one compiles everywhere.
        let arches: Option<Vec<String>> = sharers
            .map(|i| i.arches.as_ref())
            .collect::<Option<Vec<_>>>()
            .map(|lists| lists.into_iter().flatten().cloned().collect::<BTreeSet<_>>().into_iter().collect());
        jobs.push((imp, job, arch_cfg(arches.as_deref())));
    }
    if jobs.is_empty() {
        return String::new();
    }
    let module_cfg = arch_cfg(users_arches(implementations, "team").as_deref()).unwrap_or_default();
    let mut out = String::new();
    let arm = |out: &mut String, imp: &Implementation, cfg: &Option<String>, body: &str| {
        if let Some(cfg) = cfg {
            writeln!(out, "            {cfg}").unwrap();
        }
        writeln!(out, "            TeamJob::{}(job) => {body},", imp.module).unwrap();
    };
    out.push_str("    /// The work of every kernel on the thread team of `shared/team.rs`.\n");
    writeln!(out, "    {module_cfg}").unwrap();
    out.push_str(
        "    #[derive(Clone, Copy)]\n    #[allow(non_camel_case_types)]\n    pub(crate) enum TeamJob {\n",
    );
    for (imp, job, cfg) in &jobs {
        if let Some(cfg) = cfg {
            writeln!(out, "        {cfg}").unwrap();
        }
        writeln!(out, "        {}({job}),", imp.module).unwrap();
    }
    out.push_str("    }\n");
    for (imp, job, cfg) in &jobs {
        if let Some(cfg) = cfg {
            writeln!(out, "    {cfg}").unwrap();
        }
        writeln!(
            out,
            "    impl From<{job}> for TeamJob {{ fn from(job: {job}) -> TeamJob {{ TeamJob::{m}(job) }} }}",
            m = imp.module
        )
        .unwrap();
    }
    writeln!(out, "    {module_cfg}").unwrap();
    out.push_str("    impl shared::team::Job for TeamJob {\n");
    for (method, body) in [
        ("fn extent(&self) -> shared::team::Extent", "job.extent()"),
        ("unsafe fn columns(&self, cols: std::ops::Range<usize>)", "unsafe { job.columns(cols) }"),
    ] {
        writeln!(out, "        {method} {{\n            match self {{").unwrap();
        for (imp, _, cfg) in &jobs {
            arm(&mut out, imp, cfg, body);
        }
        out.push_str("            }\n        }\n");
    }
    out.push_str("    }\n");
    out
}

fn for_each_macros(implementations: &[Implementation], references: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    for (family, reference) in references {
        let mut members: Vec<&Implementation> =
            implementations.iter().filter(|i| &i.family == family).collect();
        members.sort_by_key(|i| &i.name != reference);
        writeln!(
            out,
            "/// Calls `$callback!(name, module, available)` for every implementation of `{family}`,"
        )
        .unwrap();
        writeln!(
            out,
            "/// the reference (`{reference}`) first; `available` says whether this CPU can run it."
        )
        .unwrap();
        out.push_str("#[macro_export]\n");
        writeln!(out, "macro_rules! for_each_{family} {{").unwrap();
        out.push_str("    ($callback:ident) => {\n");
        for imp in members {
            if let Some(cfg) = imp.arch_cfg() {
                writeln!(out, "        {cfg}").unwrap();
            }
            writeln!(out, "        $callback!({:?}, {}, {});", imp.name, imp.module, imp.available("$crate"))
                .unwrap();
        }
        out.push_str("    };\n}\n\n");
    }
    out
}

fn conformance_tests(implementations: &[Implementation], references: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    for imp in implementations {
        let reference = &references[&imp.family];
        let reference_module = &implementations
            .iter()
            .find(|i| i.family == imp.family && &i.name == reference)
            .expect("main checks that every family's reference exists")
            .module;
        let label = &imp.label;
        let check = format!("crate::conform_{}!({}, {reference_module});", imp.family, imp.module);
        writeln!(out, "/// `{label}` against the reference `{}/{reference}`.", imp.interface).unwrap();
        out.push_str("#[test]\n#[allow(non_snake_case)]\n");
        writeln!(out, "fn {}() {{", imp.module).unwrap();
        match imp.arch_cfg() {
            Some(cfg) => {
                writeln!(out, "    {cfg}").unwrap();
                out.push_str("    {\n");
                write_feature_gate(&mut out, imp, label, "        ");
                writeln!(out, "        {check}").unwrap();
                out.push_str("    }\n");
                let arches = imp.arches.as_deref().unwrap_or_default().join(", ");
                let predicate =
                    arch_predicate(imp.arches.as_deref()).expect("an arch-limited implementation");
                writeln!(out, "    #[cfg(not({predicate}))]").unwrap();
                writeln!(out, "    monogen_tests::skip::arch({label:?}, {arches:?});").unwrap();
            }
            None => {
                write_feature_gate(&mut out, imp, label, "    ");
                writeln!(out, "    {check}").unwrap();
            }
        }
        out.push_str("}\n\n");
    }
    out
}

/// Returns from the test, saying so, when the CPU lacks the implementation's features.
fn write_feature_gate(out: &mut String, imp: &Implementation, label: &str, indent: &str) {
    if imp.cpu_features.is_empty() {
        return;
    }
    let features: Vec<String> = imp.cpu_features.iter().map(|f| format!("{f:?}")).collect();
    writeln!(out, "{indent}if !{} {{", imp.available("crate")).unwrap();
    writeln!(out, "{indent}    monogen_tests::skip::cpu({label:?}, &[{}]);", features.join(", ")).unwrap();
    writeln!(out, "{indent}    return;").unwrap();
    writeln!(out, "{indent}}}").unwrap();
}

/// `#[cfg(any(target_arch = ...))]` for a list of arches; `None` for any arch.
fn arch_cfg(arches: Option<&[String]>) -> Option<String> {
    arch_predicate(arches).map(|predicate| format!("#[cfg({predicate})]"))
}

/// `any(target_arch = ...)` for a list of arches; `None` for any arch.
fn arch_predicate(arches: Option<&[String]>) -> Option<String> {
    let list: Vec<String> = arches?.iter().map(|a| format!("target_arch = {a:?}")).collect();
    Some(format!("any({})", list.join(", ")))
}

fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()));
    let mut paths: Vec<PathBuf> = entries.map(|e| e.expect("a readable directory entry").path()).collect();
    paths.sort();
    paths
}

fn file_name(path: &Path) -> String {
    path.file_name().unwrap_or_default().to_string_lossy().into_owned()
}

/// The crates this crate depends on (its Cargo.toml's `[dependencies]`).
fn own_dependencies() -> Vec<String> {
    let manifest: toml::Table = parse_toml(&Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"));
    manifest
        .get("dependencies")
        .and_then(|d| d.as_table())
        .map_or(Vec::new(), |t| t.keys().cloned().collect())
}

fn parse_toml<T: serde::de::DeserializeOwned>(path: &Path) -> T {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn write(path: &Path, text: &str) {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
    }
    fs::write(path, text).unwrap_or_else(|e| panic!("cannot write {}: {e}", path.display()));
}
