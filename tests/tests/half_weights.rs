//! Weights stored as BF16 or F16 (as Hugging Face checkpoints often are) load into an f32
//! crate, widened once at load: a crate fed a BF16 (or F16) file computes exactly what it
//! computes from an F32 file holding the same values.

use monogen_tests::{Safetensors, model_dir};
use serde_json::json;
use stories260k_cpu_f32::Model;

/// A 16-bit safetensors dtype name and the encoder of an f32 into its bits.
type Half<'a> = (&'a str, fn(f32) -> u16);

/// `weights` with every tensor's values replaced by `round(value)`, stored either as F32 or
/// as the 16-bit `encode(round(value))` with the given dtype name.
fn rewritten(weights: &[u8], round: fn(f32) -> f32, half: Option<Half>) -> Vec<u8> {
    let source = Safetensors::parse(weights);
    let mut out = Safetensors { header: source.header.clone(), data: Vec::new() };
    for (name, entry) in source.header.iter().filter(|(name, _)| *name != "__metadata__") {
        let offsets = &entry["data_offsets"];
        let (start, end) = (offsets[0].as_u64().unwrap() as usize, offsets[1].as_u64().unwrap() as usize);
        let values =
            source.data[start..end].chunks_exact(4).map(|b| round(f32::from_le_bytes(b.try_into().unwrap())));
        let at = out.data.len();
        match half {
            Some((dtype, encode)) => {
                values.for_each(|v| out.data.extend_from_slice(&encode(v).to_le_bytes()));
                out.header[name]["dtype"] = json!(dtype);
            }
            None => values.for_each(|v| out.data.extend_from_slice(&v.to_le_bytes())),
        }
        out.header[name]["data_offsets"] = json!([at, out.data.len()]);
    }
    out.to_bytes()
}

/// Logits of every position of `ids` from a model directory holding `weights`.
fn logits(weights: &[u8], ids: &[u32]) -> Vec<f32> {
    let source = model_dir("stories260k").unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("model.safetensors"), weights).unwrap();
    std::fs::copy(source.join("tokenizer.json"), dir.path().join("tokenizer.json")).unwrap();
    let model = Model::load(dir.path()).unwrap();
    assert!(model.warnings().is_empty(), "{:?}", model.warnings());
    model.session().logits_all(ids).unwrap()
}

/// Truncation to bfloat16: the high 16 bits of the f32.
fn to_bf16(v: f32) -> f32 {
    f32::from_bits(v.to_bits() & 0xffff_0000)
}

fn bf16_bits(v: f32) -> u16 {
    (v.to_bits() >> 16) as u16
}

/// Truncation to a normal IEEE half (10 fraction bits); values below the smallest normal
/// half (2⁻¹⁴) become zero, so that every rounded value has an exact F16 encoding.
fn to_f16(v: f32) -> f32 {
    if v.abs() < 2f32.powi(-14) { 0.0 } else { f32::from_bits(v.to_bits() & 0xffff_e000) }
}

fn f16_bits(v: f32) -> u16 {
    if v == 0.0 {
        return 0;
    }
    let bits = v.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exponent = ((bits >> 23) & 0xff) as i32 - 127 + 15;
    assert!((1..31).contains(&exponent), "{v} has no normal half");
    sign | ((exponent as u16) << 10) | ((bits >> 13) & 0x3ff) as u16
}

#[test]
fn bf16_and_f16_files_compute_what_their_f32_twins_compute() {
    let Some(dir) = model_dir("stories260k") else { return };
    let weights = std::fs::read(dir.join("model.safetensors")).unwrap();
    let ids = [1, 403, 407, 261, 378, 426, 271, 1015 % 512, 280, 259];
    for (dtype, round, encode) in
        [("BF16", to_bf16 as fn(f32) -> f32, bf16_bits as fn(f32) -> u16), ("F16", to_f16, f16_bits)]
    {
        let twin = logits(&rewritten(&weights, round, None), &ids);
        let half = logits(&rewritten(&weights, round, Some((dtype, encode))), &ids);
        assert_eq!(half.len(), twin.len());
        assert!(
            half.iter().zip(&twin).all(|(a, b)| a.to_bits() == b.to_bits()),
            "{dtype} logits differ from their F32 twin's"
        );
        // And the rounding is real: the logits moved away from the f32 model's.
        let exact = logits(&weights, &ids);
        assert!(half.iter().zip(&exact).any(|(a, b)| a != b), "{dtype}: rounding changed nothing");
    }
}
