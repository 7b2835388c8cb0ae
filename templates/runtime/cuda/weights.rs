//! The weights of a CUDA crate: read from model.safetensors on the host (F32, BF16 or F16, each
//! tensor checked for its name and shape), converted to the element type the GPU holds them in
//! ([`crate::Weight`] for the matrices, f32 for the norms) and uploaded once.

use std::path::Path;

use crate::gpu::{CudaSlice, Gpu};
use crate::tensor_file::TensorFile;
use crate::{Error, HIDDEN_SIZE, INTERMEDIATE_SIZE, KV_DIM, NUM_LAYERS, Q_DIM, VOCAB_SIZE, Weight};

/// One decoder layer's weights, on the GPU.
pub struct LayerWeights {
    pub(crate) input_layernorm: CudaSlice<f32>,
    pub(crate) q_proj: CudaSlice<Weight>,
    pub(crate) k_proj: CudaSlice<Weight>,
    pub(crate) v_proj: CudaSlice<Weight>,
    /// The projections' biases: [Q_DIM], [KV_DIM], [KV_DIM]
    #[only_if(qkv_bias)]
    pub(crate) q_bias: CudaSlice<f32>,
    #[only_if(qkv_bias)]
    pub(crate) k_bias: CudaSlice<f32>,
    #[only_if(qkv_bias)]
    pub(crate) v_bias: CudaSlice<f32>,
    pub(crate) o_proj: CudaSlice<Weight>,
    pub(crate) post_attention_layernorm: CudaSlice<f32>,
    pub(crate) gate_proj: CudaSlice<Weight>,
    pub(crate) up_proj: CudaSlice<Weight>,
    pub(crate) down_proj: CudaSlice<Weight>,
}

/// Every weight of the model, on the GPU.
pub struct Weights {
    /// [VOCAB_SIZE, HIDDEN_SIZE]; the classifier too, where the embeddings are tied.
    pub(crate) embed_tokens: CudaSlice<Weight>,
    pub(crate) layers: Vec<LayerWeights>,
    pub(crate) norm: CudaSlice<f32>,
    /// The classifier: [VOCAB_SIZE, HIDDEN_SIZE].
    #[only_if(not(tied))]
    pub(crate) lm_head: CudaSlice<Weight>,
    warnings: Vec<String>,
}

impl Weights {
    /// Reads `path` (or the shards its index lists) and uploads every tensor to `gpu`.
    pub fn load(gpu: &Gpu, path: &Path) -> Result<Weights, Error> {
        // Each tensor is read as f32 on the host (a widened copy of a half-precision one),
        // converted to the element type the GPU holds it in, and uploaded.
        let mut reader = TensorFile::open(path)?;
        let matrix = |reader: &mut TensorFile, name: &str, shape: &[usize]| -> Result<CudaSlice<Weight>, Error> {
            let values = reader.read_f32(name, shape)?;
            let held: Vec<Weight> = values.iter().map(|&v| to_weight(v)).collect();
            Ok(gpu.upload(&held)?)
        };
        let vector = |reader: &mut TensorFile, name: &str| -> Result<CudaSlice<f32>, Error> {
            Ok(gpu.upload(&reader.read_f32(name, &[HIDDEN_SIZE])?)?)
        };
        #[only_if(qkv_bias)]
        let bias = |reader: &mut TensorFile, name: &str, len: usize| -> Result<CudaSlice<f32>, Error> {
            Ok(gpu.upload(&reader.read_f32(name, &[len])?)?)
        };
        let embed_tokens = matrix(&mut reader, "model.embed_tokens.weight", &[VOCAB_SIZE, HIDDEN_SIZE])?;
        let mut layers = Vec::with_capacity(NUM_LAYERS);
        for l in 0..NUM_LAYERS {
            let p = format!("model.layers.{l}");
            layers.push(LayerWeights {
                input_layernorm: vector(&mut reader, &format!("{p}.input_layernorm.weight"))?,
                q_proj: matrix(&mut reader, &format!("{p}.self_attn.q_proj.weight"), &[Q_DIM, HIDDEN_SIZE])?,
                k_proj: matrix(&mut reader, &format!("{p}.self_attn.k_proj.weight"), &[KV_DIM, HIDDEN_SIZE])?,
                v_proj: matrix(&mut reader, &format!("{p}.self_attn.v_proj.weight"), &[KV_DIM, HIDDEN_SIZE])?,
                #[only_if(qkv_bias)]
                q_bias: bias(&mut reader, &format!("{p}.self_attn.q_proj.bias"), Q_DIM)?,
                #[only_if(qkv_bias)]
                k_bias: bias(&mut reader, &format!("{p}.self_attn.k_proj.bias"), KV_DIM)?,
                #[only_if(qkv_bias)]
                v_bias: bias(&mut reader, &format!("{p}.self_attn.v_proj.bias"), KV_DIM)?,
                o_proj: matrix(&mut reader, &format!("{p}.self_attn.o_proj.weight"), &[HIDDEN_SIZE, Q_DIM])?,
                post_attention_layernorm: vector(&mut reader, &format!("{p}.post_attention_layernorm.weight"))?,
                gate_proj: matrix(&mut reader, &format!("{p}.mlp.gate_proj.weight"), &[INTERMEDIATE_SIZE, HIDDEN_SIZE])?,
                up_proj: matrix(&mut reader, &format!("{p}.mlp.up_proj.weight"), &[INTERMEDIATE_SIZE, HIDDEN_SIZE])?,
                down_proj: matrix(&mut reader, &format!("{p}.mlp.down_proj.weight"), &[HIDDEN_SIZE, INTERMEDIATE_SIZE])?,
            });
        }
        let norm = vector(&mut reader, "model.norm.weight")?;
        #[only_if(not(tied))]
        let lm_head = matrix(&mut reader, "lm_head.weight", &[VOCAB_SIZE, HIDDEN_SIZE])?;
        let (_storage, warnings) = reader.finish(&[]);
        Ok(Weights {
            embed_tokens,
            layers,
            norm,
            #[only_if(not(tied))]
            lm_head,
            warnings,
        })
    }

    /// Writes the checkpoint at `from` to `to` as one model.safetensors of f32 tensors (a
    /// sharded or half-precision checkpoint read once), without a GPU. Returns the warnings of
    /// reading it.
    pub fn save(from: &Path, to: &Path) -> Result<Vec<String>, Error> {
        let mut file = TensorFile::open(from)?.saving();
        let mut names = vec![("model.embed_tokens.weight".to_string(), vec![VOCAB_SIZE, HIDDEN_SIZE])];
        for l in 0..NUM_LAYERS {
            let p = format!("model.layers.{l}");
            names.extend([
                (format!("{p}.input_layernorm.weight"), vec![HIDDEN_SIZE]),
                (format!("{p}.self_attn.q_proj.weight"), vec![Q_DIM, HIDDEN_SIZE]),
                (format!("{p}.self_attn.k_proj.weight"), vec![KV_DIM, HIDDEN_SIZE]),
                (format!("{p}.self_attn.v_proj.weight"), vec![KV_DIM, HIDDEN_SIZE]),
                (format!("{p}.self_attn.o_proj.weight"), vec![HIDDEN_SIZE, Q_DIM]),
                (format!("{p}.post_attention_layernorm.weight"), vec![HIDDEN_SIZE]),
                (format!("{p}.mlp.gate_proj.weight"), vec![INTERMEDIATE_SIZE, HIDDEN_SIZE]),
                (format!("{p}.mlp.up_proj.weight"), vec![INTERMEDIATE_SIZE, HIDDEN_SIZE]),
                (format!("{p}.mlp.down_proj.weight"), vec![HIDDEN_SIZE, INTERMEDIATE_SIZE]),
            ]);
        }
        #[only_if(qkv_bias)]
        for l in 0..NUM_LAYERS {
            let p = format!("model.layers.{l}.self_attn");
            names.extend([
                (format!("{p}.q_proj.bias"), vec![Q_DIM]),
                (format!("{p}.k_proj.bias"), vec![KV_DIM]),
                (format!("{p}.v_proj.bias"), vec![KV_DIM]),
            ]);
        }
        names.push(("model.norm.weight".to_string(), vec![HIDDEN_SIZE]));
        #[only_if(not(tied))]
        names.push(("lm_head.weight".to_string(), vec![VOCAB_SIZE, HIDDEN_SIZE]));
        for (name, shape) in &names {
            file.f32(name, shape)?;
        }
        let (storage, warnings) = file.finish(&[]);
        storage.save(to)?;
        Ok(warnings)
    }

    /// What loading noticed but did not refuse (e.g. tensors this model does not use).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }
}

/// An f32 weight as the GPU holds it: the nearest bfloat16 (ties to even; a NaN stays a NaN).
#[only_if(bf16)]
fn to_weight(v: f32) -> Weight {
    if v.is_nan() {
        return ((v.to_bits() >> 16) | 0x40) as u16;
    }
    let bits = v.to_bits();
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// An f32 weight as the GPU holds it: as it is.
#[only_if(not(bf16))]
fn to_weight(v: f32) -> Weight {
    v
}
