//! `Model::save_model` (the binaries' `--save-model DIR`): a crate writes a model directory
//! whose model.safetensors holds every tensor as the crate holds it in memory (an int8
//! crate's matrices quantized, with their scales; a bf16 crate's in bfloat16; a crate whose
//! matmul packs its weights, its matrices packed, with the layout's name), and loading
//! that directory maps them instead of converting them. Checked on the real models: the saved
//! files hold what they should, the crates compute bit for bit what they compute from the
//! original checkpoint, saving is deterministic, and a damaged saved file is an error naming
//! the tensor.

use std::path::Path;

use all_minilm_l6_v2_cpu_int8 as minilm_int8;
use monogen_tests::model_dir;
use serde_json::Value;
use stories260k_cpu_bf16 as bf16;
use stories260k_cpu_bf16_bf16act as bf16act;
use stories260k_cpu_int4 as int4;
use stories260k_cpu_int4_q8_classifier as int4_q8_classifier;
use stories260k_cpu_int8 as int8;

/// The JSON header of a safetensors file and the offset of its data.
fn header(bytes: &[u8]) -> (Value, usize) {
    let len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (serde_json::from_slice(&bytes[8..8 + len]).unwrap(), 8 + len)
}

/// A prompt and the story the f32 model continues it with, as ids.
fn story() -> Vec<u32> {
    let dir = model_dir("stories260k").expect("checked by the caller");
    let reference = monogen_tests::reference_json(&dir);
    let case = &reference["greedy"][0];
    let mut ids = monogen_tests::ids(&case["prompt_ids"]);
    ids.extend(monogen_tests::ids(&case["new_ids"]));
    ids
}

/// The dtype of every tensor of the header whose name ends with `suffix`.
fn dtypes_ending(header: &Value, suffix: &str) -> Vec<String> {
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(name, _)| name.ends_with(suffix))
        .map(|(_, info)| info["dtype"].as_str().unwrap().to_string())
        .collect()
}

/// Asserts that crate `$krate` loads directory `$saved` (which it saved from model directory
/// `$dir` as the file `$bytes`) without warnings, computes the same logits from it as from
/// `$dir`, bit for bit, and saves it again (into `$temp/again`) byte for byte.
macro_rules! assert_faithful {
    ($krate:ident, $dir:expr, $saved:expr, $bytes:expr, $temp:expr) => {{
        let ids = story();
        let from_checkpoint = $krate::Model::load($dir).unwrap().session().logits_all(&ids).unwrap();
        let from_saved = $krate::Model::load($saved).unwrap();
        assert!(from_saved.warnings().is_empty(), "{:?}", from_saved.warnings());
        let logits = from_saved.session().logits_all(&ids).unwrap();
        assert!(
            from_checkpoint.iter().zip(&logits).all(|(a, b)| a.to_bits() == b.to_bits()),
            "the logits differ"
        );
        let again = $temp.join("again");
        $krate::Model::save_model($saved, &again).unwrap();
        assert!(std::fs::read(again.join("model.safetensors")).unwrap() == *$bytes, "a second save differs");
    }};
}

#[test]
fn an_int8_crate_saves_its_quantized_matrices_and_computes_the_same_from_them() {
    let Some(dir) = model_dir("stories260k") else { return };
    let temp = tempfile::tempdir().unwrap();
    let saved = temp.path().join("saved");
    let warnings = int8::Model::save_model(&dir, &saved).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");

    let bytes = std::fs::read(saved.join("model.safetensors")).unwrap();
    let (header, _) = header(&bytes);
    assert_eq!(header["__metadata__"]["monogen.workload"], "stories260k-cpu-int8");
    // 5 layers of 7 matrices and the (tied) embedding, each with its scales; the norms in f32.
    assert_eq!(dtypes_ending(&header, "proj.weight"), vec!["I8"; 35]);
    assert_eq!(dtypes_ending(&header, "proj.weight_scale"), vec!["F32"; 35]);
    assert_eq!(dtypes_ending(&header, "embed_tokens.weight"), ["I8"]);
    assert_eq!(header["model.embed_tokens.weight_scale"]["shape"], serde_json::json!([512, 2]));
    assert_eq!(dtypes_ending(&header, "norm.weight"), vec!["F32"; 11]);
    let original = std::fs::metadata(dir.join("model.safetensors")).unwrap().len();
    assert!((bytes.len() as u64) < original / 3, "{} bytes saved of {original}", bytes.len());
    // The config and the tokenizer come along, so that the directory is a model directory.
    for file in ["config.json", "tokenizer.json"] {
        assert_eq!(
            std::fs::read(saved.join(file)).unwrap(),
            std::fs::read(dir.join(file)).unwrap(),
            "{file}"
        );
    }

    assert_faithful!(int8, &dir, &saved, &bytes, temp.path());
}

#[test]
fn an_int4_crate_saves_its_four_bit_matrices_as_the_interface_lays_them_out() {
    let Some(dir) = model_dir("stories260k") else { return };
    let temp = tempfile::tempdir().unwrap();
    let saved = temp.path().join("saved");
    let warnings = int4::Model::save_model(&dir, &saved).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let bytes = std::fs::read(saved.join("model.safetensors")).unwrap();
    let (saved_header, offset) = header(&bytes);
    let data = &bytes[offset..];
    let original = std::fs::read(dir.join("model.safetensors")).unwrap();
    let (original_header, offset) = header(&original);
    let original_data = &original[offset..];
    let header = saved_header;
    assert_eq!(header["__metadata__"]["monogen.workload"], "stories260k-cpu-int4");
    // 5 layers of 7 matrices and the (tied) embedding, 16 bytes and a binary16 scale and
    // minimum per block of 32; the norms in f32.
    assert_eq!(dtypes_ending(&header, "proj.weight"), vec!["U8"; 35]);
    assert_eq!(dtypes_ending(&header, "proj.weight_scale"), vec!["F16"; 35]);
    assert_eq!(header["model.embed_tokens.weight"]["shape"], serde_json::json!([512, 32]));
    assert_eq!(header["model.layers.0.mlp.down_proj.weight"]["shape"], serde_json::json!([64, 96]));
    assert_eq!(header["model.layers.0.mlp.down_proj.weight_scale"]["shape"], serde_json::json!([64, 6, 2]));
    assert_eq!(dtypes_ending(&header, "norm.weight"), vec!["F32"; 11]);

    // Every value of the checkpoint is within half a step of what the saved bytes stand for, and
    // what the minimum's and the scale's rounding to binary16 adds.
    let tensor = |header: &serde_json::Value, data: &[u8], name: &str| {
        let range = &header[name]["data_offsets"];
        data[range[0].as_u64().unwrap() as usize..range[1].as_u64().unwrap() as usize].to_vec()
    };
    for name in ["model.layers.0.mlp.down_proj.weight", "model.layers.4.self_attn.q_proj.weight"] {
        let values = tensor(&original_header, original_data, name);
        let values: Vec<f32> =
            values.chunks_exact(4).map(|b| f32::from_le_bytes(b.try_into().unwrap())).collect();
        let cols = original_header[name]["shape"][1].as_u64().unwrap() as usize;
        let (packed, scales) = (tensor(&header, data, name), tensor(&header, data, &format!("{name}_scale")));
        let blocks = cols.div_ceil(32);
        for (i, &v) in values.iter().enumerate() {
            let (row, k) = (i / cols, i % cols);
            let block = row * blocks + k / 32;
            let value = |i: usize| half(u16::from_le_bytes([scales[2 * i], scales[2 * i + 1]]));
            let (scale, minimum) = (value(2 * block), value(2 * block + 1));
            let byte = packed[block * 16 + k % 16];
            let q = if k % 32 < 16 { byte & 0x0f } else { byte >> 4 };
            let error = (v - (scale * f32::from(q) + minimum)).abs();
            let allowed = scale / 2.0 + (15.0 * scale + minimum.abs()) / 2048.0 + 1e-7;
            assert!(scale >= 0.0, "{name}: block {block}'s scale {scale} is negative");
            assert!(
                error <= allowed,
                "{name}[{row}, {k}] = {v}: {q} of {scale} from {minimum} is {error} off"
            );
        }
    }
    assert_faithful!(int4, &dir, &saved, &bytes, temp.path());

    // A scale or a minimum that is infinite or NaN is an error naming the tensor.
    let error = |damaged: &tempfile::TempDir| {
        int4::Model::load(damaged.path()).err().expect("a damaged file is an error").to_string()
    };
    let scales = "model.layers.2.mlp.gate_proj.weight_scale";
    for (at, bits) in [(6, 0x7c00u16), (0, 0xfc00), (10, 0x7e01)] {
        let e = error(&damaged(&saved, scales, |s| s[at..at + 2].copy_from_slice(&bits.to_le_bytes())));
        assert!(e.contains(scales) && e.contains("infinite or NaN"), "{bits:#x}: {e}");
    }
}

/// The value of binary16 `bits`.
fn half(bits: u16) -> f32 {
    let magnitude = match (bits >> 10) & 0x1f {
        0 => f32::from(bits & 0x3ff) * 2f32.powi(-24),
        e => (1.0 + f32::from(bits & 0x3ff) / 1024.0) * 2f32.powi(i32::from(e) - 15),
    };
    if bits & 0x8000 != 0 { -magnitude } else { magnitude }
}

#[test]
fn a_bf16_crate_saves_its_matrices_in_bfloat16() {
    let Some(dir) = model_dir("stories260k") else { return };
    let temp = tempfile::tempdir().unwrap();
    bf16::Model::save_model(&dir, temp.path()).unwrap();
    let bytes = std::fs::read(temp.path().join("model.safetensors")).unwrap();
    let (header, _) = header(&bytes);
    assert_eq!(dtypes_ending(&header, "proj.weight"), vec!["BF16"; 35]);
    assert_eq!(dtypes_ending(&header, "norm.weight"), vec!["F32"; 11]);
    let ids = story();
    let from_checkpoint = bf16::Model::load(&dir).unwrap().session().logits_all(&ids).unwrap();
    let from_saved = bf16::Model::load(temp.path()).unwrap().session().logits_all(&ids).unwrap();
    assert!(
        from_checkpoint.iter().zip(&from_saved).all(|(a, b)| a.to_bits() == b.to_bits()),
        "the logits differ"
    );
}

#[test]
fn a_bert_int8_crate_saves_its_quantized_matrices_and_encodes_the_same() {
    let Some(dir) = model_dir("all-minilm-l6-v2") else { return };
    let temp = tempfile::tempdir().unwrap();
    minilm_int8::Model::save_model(&dir, temp.path()).unwrap();
    let bytes = std::fs::read(temp.path().join("model.safetensors")).unwrap();
    let (header, _) = header(&bytes);
    // Six layers of four linear layers' weights (query, key, value and two dense ones) plus
    // the attention output's: every linear layer's matrix in int8, packed as the crate's
    // matmul (`q8-avx2-packed-threads`) reads it, its binary16 scales among its values.
    assert_eq!(dtypes_ending(&header, ".weight.packed"), vec!["I8"; 36]);
    assert!(dtypes_ending(&header, ".weight_scale").is_empty());
    assert!(dtypes_ending(&header, ".weight").iter().all(|d| d != "I8"));

    let sentences = ["A man is eating food.", "The quick brown fox jumps over the lazy dog."];
    let vectors = |model_dir: &Path| {
        let model = minilm_int8::Model::load(model_dir).unwrap();
        let tokenizer = minilm_int8::Tokenizer::load(model_dir).unwrap();
        let ids: Vec<Vec<u32>> = sentences.iter().map(|s| tokenizer.encode(s).unwrap()).collect();
        model.encoder().embed(&ids).unwrap()
    };
    assert_eq!(vectors(&dir), vectors(temp.path()));
}

#[test]
fn a_crate_with_an_int8_classifier_beside_int4_layers_saves_each_as_it_holds_it() {
    let Some(dir) = model_dir("stories260k") else { return };
    let temp = tempfile::tempdir().unwrap();
    let saved = temp.path().join("saved");
    let warnings = int4_q8_classifier::Model::save_model(&dir, &saved).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");
    let bytes = std::fs::read(saved.join("model.safetensors")).unwrap();
    let (header, _) = header(&bytes);
    assert_eq!(header["__metadata__"]["monogen.workload"], "stories260k-cpu-int4-q8-classifier");
    // The layers' 35 matrices in four bits with binary16 scales and minimums; the tied
    // embedding (the classifier) in int8 with f32 scales, one per 32 values.
    assert_eq!(dtypes_ending(&header, "proj.weight"), vec!["U8"; 35]);
    assert_eq!(dtypes_ending(&header, "proj.weight_scale"), vec!["F16"; 35]);
    assert_eq!(header["model.embed_tokens.weight"]["dtype"], "I8");
    assert_eq!(header["model.embed_tokens.weight"]["shape"], serde_json::json!([512, 64]));
    assert_eq!(header["model.embed_tokens.weight_scale"]["dtype"], "F32");
    assert_eq!(header["model.embed_tokens.weight_scale"]["shape"], serde_json::json!([512, 2]));
    assert_faithful!(int4_q8_classifier, &dir, &saved, &bytes, temp.path());
}

/// A copy of `saved` (a directory saved by an int8 or int4 crate) in a new directory, with the
/// bytes of tensor `name` rewritten by `edit`.
fn damaged(saved: &Path, name: &str, edit: impl FnOnce(&mut [u8])) -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    for file in ["config.json", "tokenizer.json"] {
        std::fs::copy(saved.join(file), out.path().join(file)).unwrap();
    }
    let mut bytes = std::fs::read(saved.join("model.safetensors")).unwrap();
    let (header, data) = header(&bytes);
    let offsets = &header[name]["data_offsets"];
    let (start, end) = (offsets[0].as_u64().unwrap() as usize, offsets[1].as_u64().unwrap() as usize);
    edit(&mut bytes[data + start..data + end]);
    std::fs::write(out.path().join("model.safetensors"), bytes).unwrap();
    out
}

#[test]
fn a_damaged_saved_file_is_an_error_naming_the_tensor() {
    let Some(dir) = model_dir("stories260k") else { return };
    let temp = tempfile::tempdir().unwrap();
    int8::Model::save_model(&dir, temp.path()).unwrap();
    let error = |damaged: &tempfile::TempDir| {
        int8::Model::load(damaged.path()).err().expect("a damaged file is an error").to_string()
    };

    // -128 has no negation in int8: the weights lie in -127..=127. One near a matrix's start,
    // and one as the very last value of another.
    let matrix = "model.layers.3.mlp.up_proj.weight";
    let e = error(&damaged(temp.path(), matrix, |values| values[77] = 0x80));
    assert!(e.contains(matrix) && e.contains("-128"), "{e}");
    let matrix = "model.layers.2.self_attn.v_proj.weight";
    let e = error(&damaged(temp.path(), matrix, |values| *values.last_mut().unwrap() = 0x80));
    assert!(e.contains(matrix) && e.contains("-128"), "{e}");

    // A scale that is NaN, infinite, negative, or not a binary16 value (0.1 has more than 11
    // significant bits; 1e-9 lies below binary16's smallest step; 7e4 above its largest value),
    // as a model saved before scales were binary16 values may hold.
    // Then the values just outside binary16's, at its edges: half its smallest step (2⁻²⁵), a
    // step and a half, its smallest normal value less half a step, and half a step above its
    // smallest normal value and above its largest value (11 bits of mantissa each).
    let scales = "model.layers.1.self_attn.k_proj.weight_scale";
    let two = |e: i32| 2f32.powi(e);
    let edges = [two(-25), 3.0 * two(-25), two(-14) - two(-25), two(-14) * (1.0 + two(-11)), 65520.0];
    for bad in [f32::NAN, f32::INFINITY, -0.5, 0.1, 1e-9, 7e4].into_iter().chain(edges) {
        let e = error(&damaged(temp.path(), scales, |s| s[4..8].copy_from_slice(&bad.to_le_bytes())));
        assert!(e.contains(scales) && e.contains("binary16"), "{bad}: {e}");
    }
    // Binary16 values are accepted: zero, its smallest step, its largest value below the normal
    // ones and its smallest normal one, 10 bits of mantissa, its largest value.
    let good = [0.0, two(-24), two(-14) - two(-24), two(-14), two(-14) * (1.0 + two(-10)), 65504.0];
    for scale in good {
        let copy = damaged(temp.path(), scales, |s| s[4..8].copy_from_slice(&scale.to_le_bytes()));
        assert!(int8::Model::load(copy.path()).is_ok(), "{scale} is a binary16 value");
    }
    // Every scale of the saved file is one: 2⁻²⁴ steps below the normal values, 10 bits of
    // mantissa above them.
    let (h, data) = header(&std::fs::read(temp.path().join("model.safetensors")).unwrap());
    let bytes = std::fs::read(temp.path().join("model.safetensors")).unwrap();
    let (start, end) = offsets(&h, scales);
    for b in bytes[data + start..data + end].chunks_exact(4) {
        let v = f32::from_le_bytes(b.try_into().unwrap());
        let binary16 =
            if v < 6.103_515_6e-5 { (v * 16_777_216.0).fract() == 0.0 } else { v.to_bits() & 0x1fff == 0 };
        assert!(v >= 0.0 && binary16, "{v} is not a binary16 value");
    }

    // Scales that are missing, or of another shape.
    let out = tempfile::tempdir().unwrap();
    let bytes = std::fs::read(temp.path().join("model.safetensors")).unwrap();
    let (h, data) = header(&bytes);
    let renamed =
        serde_json::to_string(&h).unwrap().replace(scales, "model.layers.1.self_attn.k_proj.weight_scal_");
    let mut edited = ((renamed.len()) as u64).to_le_bytes().to_vec();
    edited.extend_from_slice(renamed.as_bytes());
    edited.extend_from_slice(&bytes[data..]);
    std::fs::write(out.path().join("model.safetensors"), edited).unwrap();
    let e = int8::Model::load(out.path()).err().expect("missing scales are an error").to_string();
    assert!(e.contains(scales) && e.contains("missing"), "{e}");

    // Saving into the model directory itself would replace the weights it reads.
    let e = int8::Model::save_model(temp.path(), temp.path()).expect_err("an error").to_string();
    assert!(e.contains("model directory itself"), "{e}");
}

/// The data range (from the data's start) of tensor `name` in a safetensors header.
fn offsets(header: &Value, name: &str) -> (usize, usize) {
    let offsets = &header[name]["data_offsets"];
    (offsets[0].as_u64().unwrap() as usize, offsets[1].as_u64().unwrap() as usize)
}

#[test]
fn a_packing_crate_saves_its_matrices_packed_and_maps_them() {
    let Some(dir) = model_dir("stories260k") else { return };
    if let Err(bf16act::Error::UnsupportedCpu { missing, .. }) = bf16act::cpu::check() {
        let missing: Vec<&str> = missing.split(", ").collect();
        monogen_tests::skip::cpu("a_packing_crate_saves_its_matrices_packed_and_maps_them", &missing);
        return;
    }
    let temp = tempfile::tempdir().unwrap();
    let saved = temp.path().join("saved");
    let warnings = bf16act::Model::save_model(&dir, &saved).unwrap();
    assert!(warnings.is_empty(), "{warnings:?}");

    let bytes = std::fs::read(saved.join("model.safetensors")).unwrap();
    let (header, data) = header(&bytes);
    // The layout, named by the crate's matmul and its sources' hash.
    assert_eq!(header["monogen.packed_layout"]["dtype"], "U8");
    let (start, end) = offsets(&header, "monogen.packed_layout");
    let layout = std::str::from_utf8(&bytes[data + start..data + end]).unwrap();
    assert!(layout.starts_with("matmul/bf16act-avx512-threads 1.0.0 sha256:"), "{layout}");
    // 5 layers of 7 matrices packed (1-D, in blocks of 32 rows by 32 columns: the 64-wide
    // matrices have 2 steps of K, the 172-wide down projections 6) and none unpacked; the tied
    // classifier packed beside the embedding rows, which stay unpacked.
    assert_eq!(dtypes_ending(&header, "proj.weight.packed"), vec!["BF16"; 35]);
    assert!(dtypes_ending(&header, "proj.weight").is_empty());
    assert_eq!(
        header["model.layers.0.self_attn.q_proj.weight.packed"]["shape"],
        serde_json::json!([64 * 64])
    );
    assert_eq!(header["model.layers.0.mlp.gate_proj.weight.packed"]["shape"], serde_json::json!([192 * 64]));
    assert_eq!(header["model.layers.0.mlp.down_proj.weight.packed"]["shape"], serde_json::json!([64 * 192]));
    assert_eq!(header["model.embed_tokens.weight"]["dtype"], "BF16");
    assert_eq!(header["model.embed_tokens.weight.packed"]["shape"], serde_json::json!([512 * 64]));
    // The data start on a cache line, and so does every packed matrix: the crate maps them.
    assert_eq!(data % 64, 0);
    for (name, _) in header.as_object().unwrap().iter().filter(|(n, _)| n.ends_with(".packed")) {
        assert_eq!(offsets(&header, name).0 % 64, 0, "{name}");
    }

    assert_faithful!(bf16act, &dir, &saved, &bytes, temp.path());

    // Another layout (a kernel or shared module edited since the save) is refused, naming the
    // matrix and both layouts.
    let other = damaged(&saved, "monogen.packed_layout", |name| *name.last_mut().unwrap() ^= 1);
    let e = bf16act::Model::load(other.path()).err().expect("another layout is an error").to_string();
    assert!(e.contains(".packed`") && e.contains(layout) && e.contains("--save-model"), "{e}");
    // So is a crate whose matmul reads its matrices unpacked.
    let e = bf16::Model::load(&saved).err().expect("packed matrices are an error").to_string();
    assert!(e.contains("proj.weight.packed`") && e.contains("unpacked") && e.contains(layout), "{e}");

    // A packed matrix of the wrong length (a block short) is an error naming it.
    let matrix = "model.layers.2.mlp.down_proj.weight.packed";
    let out = tempfile::tempdir().unwrap();
    let mut header = header.clone();
    let (start, end) = offsets(&header, matrix);
    let cut = 32 * 32 * 2;
    for (_, info) in header.as_object_mut().unwrap().iter_mut().filter(|(n, _)| *n != "__metadata__") {
        let offsets = info["data_offsets"].as_array_mut().unwrap();
        for offset in offsets.iter_mut() {
            let at = offset.as_u64().unwrap() as usize;
            if at > start {
                *offset = serde_json::json!(at - cut);
            }
        }
    }
    header[matrix]["shape"] = serde_json::json!([(end - start - cut) / 2]);
    let text = serde_json::to_string(&header).unwrap();
    let mut edited = (text.len() as u64).to_le_bytes().to_vec();
    edited.extend_from_slice(text.as_bytes());
    edited.extend_from_slice(&bytes[data..data + end - cut]);
    edited.extend_from_slice(&bytes[data + end..]);
    std::fs::write(out.path().join("model.safetensors"), edited).unwrap();
    for file in ["config.json", "tokenizer.json"] {
        std::fs::copy(saved.join(file), out.path().join(file)).unwrap();
    }
    let e = bf16act::Model::load(out.path()).err().expect("a short matrix is an error").to_string();
    assert!(e.contains(matrix) && e.contains("shape"), "{e}");
}
