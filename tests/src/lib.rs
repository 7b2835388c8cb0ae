//! Support for the end-to-end tests: where the workspace and the real models are, and
//! readers for the reference files (NumPy `.npy`, `reference.json`).

pub mod http;
pub mod skip;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The workspace root (the folder with interfaces/, implementations/, templates/).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ has a parent").to_path_buf()
}

/// `MONOGEN_MODELS`, else `<workspace root>/../shared/models`.
pub fn models_root() -> PathBuf {
    match std::env::var_os("MONOGEN_MODELS") {
        Some(dir) => PathBuf::from(dir),
        None => workspace_root().join("../shared/models"),
    }
}

/// The folder of a real model, or `None` (with a note) when the models are not here.
/// Under CI (`CI=true`) a missing model is a failure, not a skip.
pub fn model_dir(name: &str) -> Option<PathBuf> {
    let dir = models_root().join(name);
    if dir.join("model.safetensors").is_file() {
        return Some(dir);
    }
    skip::model(&current_test(), &dir);
    None
}

/// `MONOGEN_PYTHON` (else `python3`) where it can import OpenAI's `openai` package, or `None`
/// (a skip of `test`) where it cannot. `.ci/run` installs the package: under CI a missing one
/// is a failure.
pub fn python_with_openai(test: &str) -> Option<String> {
    let python = std::env::var("MONOGEN_PYTHON").unwrap_or_else(|_| "python3".into());
    if Command::new(&python).args(["-c", "import openai"]).status().is_ok_and(|s| s.success()) {
        return Some(python);
    }
    skip::tool(
        test,
        &format!("the `openai` Python package (pip install openai, or set MONOGEN_PYTHON; {python})"),
    );
    None
}

/// The name of the running test: the name of its thread, as the test harness sets it.
pub fn current_test() -> String {
    std::thread::current().name().unwrap_or("a test").to_string()
}

/// Copies a generated crate (without its `target/`) to `to`.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap().flatten() {
        let name = entry.file_name();
        if name == "target" {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            copy_dir(&path, &to.join(&name));
        } else {
            std::fs::copy(&path, to.join(&name)).unwrap();
        }
    }
}

/// A little-endian float32 array from a NumPy format 1.0 `.npy` file: (shape, values).
pub fn read_npy_f32(path: &Path) -> (Vec<usize>, Vec<f32>) {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..6], b"\x93NUMPY", "{} is not a .npy file", path.display());
    assert_eq!(bytes[6], 1, "{}: only .npy format 1.0 is read", path.display());
    let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + header_len]).expect("the .npy header is ASCII");
    assert!(
        header.contains("'descr': '<f4'"),
        "{}: expected little-endian float32, header {header}",
        path.display()
    );
    assert!(header.contains("'fortran_order': False"), "{}: expected C order", path.display());
    let shape_text = header.split("'shape': (").nth(1).and_then(|s| s.split(')').next()).expect("a shape");
    let shape: Vec<usize> = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().expect("a dimension"))
        .collect();
    let data = &bytes[10 + header_len..];
    let values: Vec<f32> =
        data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    assert_eq!(
        values.len(),
        shape.iter().product::<usize>(),
        "{}: data length does not match the shape",
        path.display()
    );
    (shape, values)
}

/// `reference/reference.json` of a model.
pub fn reference_json(model: &Path) -> Value {
    let path = model.join("reference/reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A JSON array of integers as token ids.
pub fn ids(value: &Value) -> Vec<u32> {
    value.as_array().expect("an array of ids").iter().map(|v| v.as_u64().expect("an id") as u32).collect()
}

/// Largest absolute difference, with the index where it occurs.
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> (f32, usize) {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter()
        .zip(b)
        .enumerate()
        .map(|(i, (x, y))| ((x - y).abs(), i))
        .fold((0.0, 0), |m, d| if d.0 > m.0 { d } else { m })
}

/// The one target directory that every generated crate built by a test shares, so that
/// their dependencies compile once.
pub fn generated_target_dir() -> PathBuf {
    workspace_root().join("target/generated-crates")
}

/// `cargo clippy --workspace --all-targets -- -D warnings` of the manifest at `manifest` (a
/// crate, or a workspace of crates) into the shared target directory, as a user's build would
/// run it (without this process's RUSTFLAGS).
pub fn clippy(manifest: &Path) -> std::process::Output {
    Command::new(env!("CARGO"))
        .args(["clippy", "--quiet", "--workspace", "--all-targets", "--manifest-path"])
        .arg(manifest)
        .args(["--", "-D", "warnings"])
        .env("CARGO_TARGET_DIR", generated_target_dir())
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .output()
        .expect("cargo runs")
}

/// `cargo build` of the crate at `dir` into the shared target directory; returns the binary.
pub fn build_crate(dir: &Path, name: &str) -> PathBuf {
    let target = generated_target_dir();
    let status = Command::new(env!("CARGO"))
        .args(["build", "--quiet", "--manifest-path"])
        .arg(dir.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .status()
        .expect("cargo runs");
    assert!(status.success(), "cargo build of {} failed", dir.display());
    target.join("debug").join(name)
}

/// Copies the committed crate `name` out of the repository (to target/generated-copies/, without
/// its target/), checks that it stands alone (its own empty workspace, no path or git
/// dependencies) and builds it there; returns its binary.
pub fn build_copy(name: &str) -> PathBuf {
    let copy = workspace_root().join("target/generated-copies").join(name);
    let _ = std::fs::remove_dir_all(&copy);
    copy_dir(&workspace_root().join("generated").join(name), &copy);
    let manifest = std::fs::read_to_string(copy.join("Cargo.toml")).expect("the copy has a Cargo.toml");
    assert!(manifest.contains("\n[workspace]\n"), "{name} declares its own workspace");
    assert!(
        !manifest.contains("path =") && !manifest.contains("git ="),
        "no path or git dependencies:\n{manifest}"
    );
    build_crate(&copy, name)
}

/// A copy of stories260k whose weights also hold `lm_head.weight` (a copy of the
/// embedding), so that a crate generated with untied embeddings computes exactly the
/// reference logits. Made once per test process under target/; `None` without the model.
pub fn untied_stories260k() -> Option<PathBuf> {
    static DIR: std::sync::OnceLock<Option<PathBuf>> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let source = model_dir("stories260k")?;
        let dir =
            workspace_root().join(format!("target/test-models/stories260k-untied-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("reference")).unwrap();
        for file in ["tokenizer.json", "reference/logits.npy", "reference/reference.json"] {
            std::fs::copy(source.join(file), dir.join(file)).unwrap();
        }
        let weights = std::fs::read(source.join("model.safetensors")).unwrap();
        let with_head = add_tensor_copy(&weights, "model.embed_tokens.weight", "lm_head.weight");
        std::fs::write(dir.join("model.safetensors"), with_head).unwrap();
        Some(dir)
    })
    .clone()
}

/// A safetensors file with one more tensor, `to`, holding the same data as `from`.
pub fn add_tensor_copy(file: &[u8], from: &str, to: &str) -> Vec<u8> {
    let mut st = Safetensors::parse(file);
    let entry = st.header[from].clone();
    let offsets = &entry["data_offsets"];
    let (start, end) = (offsets[0].as_u64().unwrap() as usize, offsets[1].as_u64().unwrap() as usize);
    let mut copy = entry.clone();
    copy["data_offsets"] = serde_json::json!([st.data.len(), st.data.len() + (end - start)]);
    st.header.insert(to.to_string(), copy);
    let tensor = st.data[start..end].to_vec();
    st.data.extend_from_slice(&tensor);
    st.to_bytes()
}

/// A safetensors file taken apart: the JSON header (name → entry) and the data, so that tests
/// can damage it in one specific way and write it back.
pub struct Safetensors {
    pub header: serde_json::Map<String, Value>,
    pub data: Vec<u8>,
}

impl Safetensors {
    pub fn parse(file: &[u8]) -> Safetensors {
        let header_len = u64::from_le_bytes(file[..8].try_into().unwrap()) as usize;
        let header = serde_json::from_slice(&file[8..8 + header_len]).unwrap();
        Safetensors { header, data: file[8 + header_len..].to_vec() }
    }

    /// The file, with the header padded to a multiple of 8 bytes as writers do.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut header = serde_json::to_vec(&self.header).unwrap();
        while !header.len().is_multiple_of(8) {
            header.push(b' ');
        }
        let mut out = Vec::with_capacity(8 + header.len() + self.data.len());
        out.extend_from_slice(&(header.len() as u64).to_le_bytes());
        out.extend_from_slice(&header);
        out.extend_from_slice(&self.data);
        out
    }
}
