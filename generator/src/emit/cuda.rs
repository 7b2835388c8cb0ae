//! The files of a LLaMA crate for a CUDA GPU (`target.device = "cuda"`): constants, the
//! forward pass from `templates/cuda/model.rs`, the GPU and its weights
//! (`templates/runtime/cuda/`), the chosen kernels, each a launcher (`src/kernels/<interface>.rs`)
//! and its CUDA C (`src/kernels/<interface>.cu`, after the workload's constants), and the host
//! runtime that CPU crates share (tokenizer, sampling loop, command line).

use std::collections::BTreeMap;

use proc_macro2::TokenStream;
use quote::quote;

use super::{Templates, common, crate_ident};
use crate::Error;
use crate::plan::{LlamaConsts, Plan};
use crate::registry::Registry;
use crate::rust_source;
use crate::workload::{Dtype, KvDtype};

/// The crates a CUDA LLaMA crate depends on (versions in templates/dependencies.toml).
pub const DEPENDENCIES: &[&str] =
    &["clap", "cudarc", "memmap2", "safetensors", "serde", "serde_json", "thiserror", "tokenizers"];

/// The host runtime files it shares with CPU crates.
const RUNTIME_FILES: &[&str] = &[
    "detokenizer.rs",
    "error.rs",
    "generate.rs",
    "main.rs",
    "tensor_file.rs",
    "tokenizer.rs",
    "tokenizer_file.rs",
];

/// Every file of the crate but its Cargo.toml, README and lock: (relative path, body).
pub fn files(
    plan: &Plan,
    c: &LlamaConsts,
    registry: &Registry,
    templates: &Templates,
) -> Result<Vec<(String, String)>, Error> {
    let krate = crate_ident(&plan.name);
    let tied = c.tie_word_embeddings;
    let bf16 = plan.weights.dtype == Dtype::Bf16;
    let features = [
        ("chat", false),
        ("prefix_cache", false),
        ("speculation", false),
        ("prompt_lookup", false),
        ("draft_model", false),
        ("batched", false),
        ("cuda", true),
        ("tied", tied),
        ("bf16", bf16),
        ("qkv_bias", c.qkv_bias),
    ];
    let mut files = vec![
        ("src/lib.rs".to_string(), rust_source::print_tokens(lib_rs(plan, c))),
        ("src/model.rs".to_string(), model_rs(plan, c, templates)?),
        ("src/kernels/mod.rs".to_string(), rust_source::print_tokens(kernels_mod_rs(plan))),
        ("src/kernels/model.cu".to_string(), cuda_file(plan, c, &model_cu(c, templates)?, false)),
    ];
    let runtime = RUNTIME_FILES.iter().map(|f| (f.to_string(), format!("src/{f}")));
    let gpu = ["gpu.rs", "weights.rs"].into_iter().map(|f| (format!("cuda/{f}"), format!("src/{f}")));
    for (file, path) in runtime.chain(gpu) {
        let mut source = templates.runtime(&file, &krate)?;
        rust_source::select(&mut source, &features)
            .map_err(|message| Error::Template { name: format!("runtime/{file}"), message })?;
        if file == "tensor_file.rs" {
            // What the CUDA weights, read as f32 on the host, never call.
            rust_source::remove_methods(
                &mut source,
                super::common::Matrices::of(plan).unused_tensor_file_methods(),
            );
        }
        if file == "tokenizer.rs" {
            rust_source::remove_methods(&mut source, &["encode_as_is"]);
        }
        files.push((path, rust_source::print(&source)));
    }
    for (path, body) in common::kernel_files(plan, registry)? {
        files.push((path, body));
    }
    for i in &plan.interfaces {
        let imp = registry
            .implementation(&i.interface, &i.chosen.name, i.element.as_deref())
            .expect("the plan only names implementations of the registry it was resolved against");
        if let Some(cu) = &imp.cuda_source {
            let provenance = format!(
                "// {}: `{}` {}, from {}/kernel.cu\n",
                i.title(),
                imp.name,
                imp.version,
                imp.dir.display().to_string().replace('\\', "/")
            );
            let body = cuda_file(plan, c, cu, i.interface == "matmul");
            files.push((format!("src/kernels/{}.cu", i.module()), provenance + &body));
        }
    }
    Ok(files)
}

/// The forward pass's own kernels (`templates/runtime/cuda/model.cu`), and the adding of the
/// q/k/v projections' biases (`bias.cu`) where the model has them.
fn model_cu(c: &LlamaConsts, templates: &Templates) -> Result<String, Error> {
    let mut source = templates.get("runtime/cuda/model.cu")?.to_string();
    if c.qkv_bias {
        source.push('\n');
        source.push_str(templates.get("runtime/cuda/bias.cu")?);
    }
    Ok(source)
}

/// The (N, K) of every matrix product of the forward pass, in order of first use, each once.
fn matmul_shapes(c: &LlamaConsts) -> Vec<(usize, usize)> {
    let (h, i) = (c.hidden_size, c.intermediate_size);
    let mut shapes = Vec::new();
    for shape in [(c.q_dim, h), (c.kv_dim, h), (h, c.q_dim), (i, h), (h, i), (c.vocab_size, h)] {
        if !shapes.contains(&shape) {
            shapes.push(shape);
        }
    }
    shapes
}

/// A kernel file of the crate: the workload's constants and element types, then `source`
/// (the list of the products' shapes too, for the matmul's).
fn cuda_file(plan: &Plan, c: &LlamaConsts, source: &str, products: bool) -> String {
    let (weight, widen) = match plan.weights.dtype {
        Dtype::Bf16 => (
            "unsigned short",
            "// A bfloat16 is the high half of an f32.\n__device__ __forceinline__ float widen(W w) { return __uint_as_float((unsigned int)w << 16); }",
        ),
        _ => ("float", "__device__ __forceinline__ float widen(W w) { return w; }"),
    };
    let mut out = String::from("// The workload's shapes and constants, which this file is compiled with.\n");
    let defines = [
        ("HIDDEN_SIZE", c.hidden_size.to_string()),
        ("INTERMEDIATE_SIZE", c.intermediate_size.to_string()),
        ("NUM_HEADS", c.num_heads.to_string()),
        ("NUM_KV_HEADS", c.num_kv_heads.to_string()),
        ("HEAD_DIM", c.head_dim.to_string()),
        ("Q_DIM", c.q_dim.to_string()),
        ("KV_DIM", c.kv_dim.to_string()),
        ("VOCAB_SIZE", c.vocab_size.to_string()),
        ("MAX_SEQ_LEN", c.max_seq_len.to_string()),
        ("RMS_NORM_EPS", format!("{:?}f", c.rms_norm_eps)),
        // positions a query attends to, itself included: all of them without a sliding window
        ("WINDOW", c.sliding_window.map_or_else(|| "MAX_SEQ_LEN".to_string(), |w| w.to_string())),
    ];
    for (name, value) in defines {
        out.push_str(&format!("#define {name} {value}\n"));
    }
    let kv = match c.kv_dtype {
        KvDtype::Bf16 => concat!(
            "typedef unsigned short KV;\n",
            "__device__ __forceinline__ float widen_kv(KV v) { return __uint_as_float((unsigned int)v << 16); }\n",
            "// The nearest bfloat16, ties to even; a NaN stays a NaN.\n",
            "__device__ __forceinline__ KV to_kv(float v) {\n",
            "    const unsigned int bits = __float_as_uint(v);\n",
            "    if ((bits & 0x7fffffffu) > 0x7f800000u) return (KV)((bits >> 16) | 0x40u);\n",
            "    return (KV)((bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16);\n",
            "}\n"
        ),
        KvDtype::F32 => concat!(
            "typedef float KV;\n",
            "__device__ __forceinline__ float widen_kv(KV v) { return v; }\n",
            "__device__ __forceinline__ KV to_kv(float v) { return v; }\n"
        ),
    };
    out.push_str(&format!(
        "\n// How the weights are held ({}).\ntypedef {weight} W;\n{widen}\n\n// How the KV cache holds keys and values ({}).\n{kv}",
        plan.weights.dtype.as_str(),
        c.kv_dtype.as_str()
    ));
    if products {
        let list: Vec<String> = matmul_shapes(c).iter().map(|(n, k)| format!("X({n}, {k})")).collect();
        out.push_str(&format!(
            "\n// The matrix products of the forward pass, as (N, K): each gets a kernel of its own.\n#define MATMUL_SHAPES(X) {}\n",
            list.join(" ")
        ));
    }
    out.push('\n');
    out.push_str(source.trim_start_matches('\n'));
    out
}

fn model_rs(plan: &Plan, c: &LlamaConsts, templates: &Templates) -> Result<String, Error> {
    let classifier = if c.tie_word_embeddings {
        quote!(matmul::<VOCAB_SIZE, HIDDEN_SIZE>(gpu, &mut b.logits, &b.normed, &w.embed_tokens, 1)?;)
    } else {
        quote!(matmul::<VOCAB_SIZE, HIDDEN_SIZE>(gpu, &mut b.logits, &b.normed, &w.lm_head, 1)?;)
    };
    let n_layers = c.num_layers.to_string();
    let (rope_use, rope_tables, inv_freq_fn) = super::llama::rope_parts(c.rope_scaling);
    let slots = BTreeMap::from([
        ("classifier", classifier),
        ("rope_use", rope_use),
        ("rope_tables", rope_tables),
        ("inv_freq_fn", inv_freq_fn),
    ]);
    let mut file =
        templates.rust("cuda/model.rs", &[("__workload_name", &plan.name), ("__n_layers", &n_layers)])?;
    rust_source::select(&mut file, &[("qkv_bias", c.qkv_bias)])
        .map_err(|message| Error::Template { name: "cuda/model.rs".into(), message })?;
    Templates::fill_file("cuda/model.rs", file, &slots)
}

fn kernels_mod_rs(plan: &Plan) -> TokenStream {
    let mut modules: Vec<String> = plan.interfaces.iter().map(|i| i.module()).collect();
    modules.sort();
    let mods = modules.iter().map(|m| common::kernel_module(plan, m));
    let cuda: Vec<&String> = modules.iter().filter(|m| m.as_str() != "sampler").collect();
    let sources = cuda.iter().map(|m| {
        let file = format!("{m}.cu");
        quote!((#m, include_str!(#file)),)
    });
    quote! {
        //! The chosen kernels: each interface's launcher (a module) and its CUDA C (`<module>.cu`),
        //! and the sampler, which runs on the host.
        #(#mods)*

        /// The CUDA C of every kernel file, which the GPU compiles at load (`gpu.rs`): (module, source).
        pub const SOURCES: &[(&str, &str)] = &[#(#sources)* ("model", include_str!("model.cu")),];
    }
}

fn lib_rs(plan: &Plan, c: &LlamaConsts) -> TokenStream {
    let name = &plan.name;
    let arch = plan.target.cuda_arch.as_deref().unwrap_or_default();
    let doc = format!(
        " `{name}`: a LLaMA inference crate for a CUDA GPU ({arch}), generated by monogen.\n\n Specialized for {} layers of width {}, {} query and {} key/value heads of {}, a vocabulary of {},\n {} weights, up to {} positions. Every shape is a constant below and in the kernels' CUDA C\n (src/kernels/*.cu), which the GPU compiles at load; [`model`] launches the chosen kernels\n directly. README.md says which kernels were chosen and why.",
        c.num_layers,
        c.hidden_size,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim,
        c.vocab_size,
        plan.weights.dtype.as_str(),
        c.max_seq_len
    );
    let guards = common::target_guards(plan);
    let (shapes, tokens) = (super::llama::shape_consts(name, c), super::llama::token_consts(c));
    let weight = match plan.weights.dtype {
        Dtype::Bf16 => quote!(
            /// How the GPU holds the weight matrices: bfloat16 bits (the high half of an f32).
            pub type Weight = u16;
        ),
        _ => quote!(
            /// How the GPU holds the weight matrices: f32.
            pub type Weight = f32;
        ),
    };
    let kv = match c.kv_dtype {
        KvDtype::Bf16 => quote!(
            /// How the KV cache holds keys and values on the GPU: bfloat16 bits.
            pub type Kv = u16;
        ),
        KvDtype::F32 => quote!(
            /// How the KV cache holds keys and values on the GPU: f32.
            pub type Kv = f32;
        ),
    };
    quote! {
        #![doc = #doc]
        #guards
        mod detokenizer;
        pub mod error;
        pub mod generate;
        pub mod gpu;
        mod kernels;
        pub mod model;
        mod tensor_file;
        pub mod tokenizer;
        mod tokenizer_file;
        pub mod weights;

        pub use error::Error;
        pub use generate::{GenerateParams, Generation, StopReason};
        pub use model::{Model, Session};
        pub use tokenizer::Tokenizer;

        #shapes
        /// The GPU architecture the kernels are compiled for (`target.cuda_arch`).
        pub const CUDA_ARCH: &str = #arch;
        #tokens
        #weight
        #kv
    }
}
