//! The Rust files of a BERT crate: constants, weights, the encoder's forward pass, pooling,
//! the command line, and the fixed runtime of `templates/runtime/` (errors, safetensors) and
//! `templates/runtime/bert/` (the tokenizer).
//!
//! What the workload leaves out is not generated: without pooling there is no `embed`,
//! without normalization no `normalize` and no `--no-normalize`.

use std::collections::BTreeMap;

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};

use super::common::{self, Matrices, doc, f32_lit, usize_lit};
use super::{Templates, crate_ident};
use crate::Error;
use crate::plan::{BertConsts, Plan};
use crate::registry::Registry;
use crate::rust_source::{self, comment};
use crate::workload::Pooling;

/// The crates every BERT crate depends on (versions in templates/dependencies.toml).
const DEPENDENCIES: &[&str] =
    &["clap", "memmap2", "safetensors", "serde", "serde_json", "thiserror", "tokenizers"];

/// The crates the embeddings server of a crate that serves depends on.
const SERVING_DEPENDENCIES: &[&str] = &["axum", "tokio"];

/// What `serve --help` says the server is, and what its `--model` directory holds.
const SERVE_HELP: (&str, &str) = (
    "Serves the model over HTTP: OpenAI's embeddings API, batching the sentences of requests that arrive together.",
    "Model directory holding model.safetensors and tokenizer.json.",
);

/// The crates a BERT crate depends on, the server's included where it serves.
pub fn dependencies(c: &BertConsts) -> Vec<&'static str> {
    let serving = if c.serving.is_some() { SERVING_DEPENDENCIES } else { &[] };
    DEPENDENCIES.iter().chain(serving).copied().collect()
}

/// Every `.rs` file of the crate: (relative path, formatted body without header).
pub fn rust_files(
    plan: &Plan,
    c: &BertConsts,
    registry: &Registry,
    templates: &Templates,
) -> Result<Vec<(String, String)>, Error> {
    let krate = crate_ident(&plan.name);
    let mut files = vec![
        ("src/lib.rs".to_string(), rust_source::print_tokens(lib_rs(plan, c))),
        ("src/model.rs".to_string(), model_rs(plan, c, templates)?),
        ("src/weights.rs".to_string(), rust_source::print_tokens(weights_rs(plan))),
        ("src/main.rs".to_string(), main_file(plan, c, templates, &krate)?),
        ("src/cpu.rs".to_string(), rust_source::print_tokens(common::cpu_rs(plan))),
        ("src/kernels/mod.rs".to_string(), rust_source::print_tokens(common::kernels_mod_rs(plan))),
    ];
    let matrices = Matrices::of(plan);
    for file in ["error.rs", "tensor_file.rs", "tokenizer_file.rs"] {
        let mut source = templates.runtime(file, &krate)?;
        rust_source::select(&mut source, &[("cuda", false)])
            .map_err(|message| Error::Template { name: format!("runtime/{file}"), message })?;
        if file == "tensor_file.rs" {
            rust_source::remove_methods(&mut source, matrices.unused_tensor_file_methods());
        }
        files.push((format!("src/{file}"), rust_source::print(&source)));
    }
    let mut tokenizer = templates.runtime("bert/tokenizer.rs", &krate)?;
    if c.serving.is_some() {
        let mut http = templates.runtime("http.rs", &krate)?;
        // An embeddings server has no chat template.
        rust_source::select(&mut http, &[("chat", false)])
            .map_err(|message| Error::Template { name: "runtime/http.rs".into(), message })?;
        files.push(("src/http.rs".to_string(), rust_source::print(&http)));
        // A crate that normalizes its vectors serves them normalized, as its command line prints them.
        let normalize = if c.normalize { "crate::normalize(&mut vectors);" } else { "" };
        let serve = templates
            .runtime_with("bert/serve.rs", &[("__crate", &krate), ("__normalize!(vectors);", normalize)])?;
        files.push(("src/serve.rs".to_string(), rust_source::print(&serve)));
    } else {
        // Only the server refuses a sentence the tokenizer would truncate.
        rust_source::remove_methods(&mut tokenizer, &["encode_whole"]);
    }
    files.push(("src/tokenizer.rs".to_string(), rust_source::print(&tokenizer)));
    if let Some(file) = matrices.runtime_file() {
        // The word embeddings stay f32: no embedding row is ever dequantized.
        let mut source = templates.runtime_with(file, &[("__crate", &krate)])?;
        rust_source::remove_methods(&mut source, &["dequantize_row"]);
        rust_source::remove_methods(&mut source, matrices.unused_methods());
        // Every matrix of an encoder is packed where the kernel packs: none is read unpacked.
        match matrices {
            Matrices::Q8Packed => rust_source::remove_methods(&mut source, &["q8", "q8_many"]),
            Matrices::Bf16Packed => rust_source::remove_methods(&mut source, &["bf16"]),
            _ => {}
        }
        files.push((format!("src/{file}"), rust_source::print(&source)));
    }
    files.extend(common::kernel_files(plan, registry)?);
    Ok(files)
}

fn lib_rs(plan: &Plan, c: &BertConsts) -> TokenStream {
    let w = plan;
    let name = &w.name;
    let features = plan.cpu_features.join(", ");
    let pooled = match c.pooling {
        Pooling::Mean => "mean-pools the token states into one vector per sentence",
        Pooling::Cls => "takes the [CLS] token's state as the sentence's vector",
        Pooling::None => "returns the token states (no pooling)",
    };
    let inner_doc: Vec<String> = [
        format!("`{name}`: a BERT encoder generated by monogen."),
        String::new(),
        format!(
            "Specialized for {} layers of width {}, {} heads of {}, an MLP of {}, a vocabulary of {},",
            c.num_layers, c.hidden_size, c.num_heads, c.head_dim, c.intermediate_size, c.vocab_size
        ),
        format!(
            "{} weights, batches of up to {} sentences of up to {} tokens, on {} {}{}.",
            w.weights.dtype.as_str(),
            c.max_batch,
            c.max_seq_len,
            w.target.device.as_str(),
            w.target.arch,
            if features.is_empty() { String::new() } else { format!(" with {features}") }
        ),
        format!("It {pooled}{}.", if c.normalize { ", and can L2-normalize it" } else { "" }),
        String::new(),
        "[`Model`] holds the weights (memory-mapped) and is shared between threads; each".into(),
        "[`Encoder`] owns the activation buffers of one batch. README.md says which kernels".into(),
        "were chosen and why.".into(),
    ]
    .into_iter()
    .map(|l| if l.is_empty() { l } else { format!(" {l}") })
    .collect();

    let guards = common::target_guards(plan);
    let [dim, hidden_dim, n_layers, n_heads, head_dim, vocab, types, positions, max_seq, max_batch, threads] =
        [
            c.hidden_size,
            c.intermediate_size,
            c.num_layers,
            c.num_heads,
            c.head_dim,
            c.vocab_size,
            c.type_vocab_size,
            c.max_position_embeddings,
            c.max_seq_len,
            c.max_batch,
            c.threads,
        ]
        .map(usize_lit);
    let eps = f32_lit(c.layer_norm_eps);
    let cpu_features = &plan.cpu_features;
    let n_features = usize_lit(cpu_features.len());
    let normalize_export = c.normalize.then(|| {
        quote!(
            pub use model::normalize;
        )
    });

    let (bf16_mod, q8_mod) = Matrices::of(plan).modules();
    let (serve_mods, serve_consts) = match &c.serving {
        None => (None, None),
        Some(s) => {
            let (max_queue, max_body, wait) = (
                usize_lit(s.max_queue),
                usize_lit(s.max_body_bytes),
                Literal::u64_unsuffixed(s.batch_wait_ms),
            );
            (
                Some(quote! {
                    mod http;
                    pub mod serve;
                }),
                Some(quote! {
                    /// Requests that may wait for the encoder; one more is answered 429.
                    pub const MAX_QUEUE: usize = #max_queue;
                    /// Largest request body the server reads, in bytes.
                    pub const MAX_BODY_BYTES: usize = #max_body;
                    /// How long the first sentence of a batch waits for others to join it
                    /// (`serving.batch_wait_ms`).
                    pub const BATCH_WAIT: std::time::Duration = std::time::Duration::from_millis(#wait);
                }),
            )
        }
    };

    quote! {
        #(#![doc = #inner_doc])*

        #guards

        #bf16_mod
        pub mod cpu;
        pub mod error;
        #serve_mods
        mod kernels;
        pub mod model;
        #q8_mod
        mod tensor_file;
        pub mod tokenizer;
        mod tokenizer_file;
        pub mod weights;

        pub use error::Error;
        pub use model::{Encoder, Model};
        #normalize_export
        pub use tokenizer::Tokenizer;

        /// The workload this crate was generated from.
        pub const WORKLOAD: &str = #name;
        /// Width of the hidden states.
        pub const HIDDEN_SIZE: usize = #dim;
        /// Width of the MLP's intermediate layer.
        pub const INTERMEDIATE_SIZE: usize = #hidden_dim;
        /// Encoder layers.
        pub const NUM_LAYERS: usize = #n_layers;
        /// Attention heads.
        pub const NUM_HEADS: usize = #n_heads;
        /// Width of one head.
        pub const HEAD_DIM: usize = #head_dim;
        /// Rows of the word embedding.
        pub const VOCAB_SIZE: usize = #vocab;
        /// Rows of the token-type embedding.
        pub const TYPE_VOCAB_SIZE: usize = #types;
        /// Rows of the position embedding.
        pub const MAX_POSITION_EMBEDDINGS: usize = #positions;
        /// Longest sentence, in tokens with [CLS] and [SEP]; the tokenizer truncates to it.
        pub const MAX_SEQ_LEN: usize = #max_seq;
        /// Sentences run through the layers at once; longer batches run in parts.
        pub const MAX_BATCH: usize = #max_batch;
        /// Epsilon of every LayerNorm.
        pub const LAYER_NORM_EPS: f32 = #eps;
        /// Threads the workload allows the kernels (`target.threads`): a multi-threaded kernel
        /// splits each product into this many equal shares.
        pub const THREADS: usize = #threads;
        /// CPU features the chosen kernels were compiled for, checked by [`cpu::check`].
        pub const CPU_FEATURES: [&str; #n_features] = [#(#cpu_features),*];
        #serve_consts
    }
}

/// src/model.rs: `templates/bert/model.rs` with its slots filled from the plan.
fn model_rs(plan: &Plan, c: &BertConsts, templates: &Templates) -> Result<String, Error> {
    let pooling_use = match c.pooling {
        Pooling::Mean => quote!(
            use crate::kernels::mean_pooling::mean_pool;
        ),
        _ => quote!(),
    };
    let normalize_use = c.normalize.then(|| {
        quote!(
            use crate::kernels::l2_normalize::l2_normalize;
        )
    });
    let embed_fn = embed_fn(c);
    let matrices = Matrices::of(plan);
    let mm = |shape: [&str; 2], out: TokenStream, x: TokenStream, w: TokenStream| {
        matrices.matmul_call(shape, out, x, w, quote!(rows))
    };
    let mm_q = mm(["HIDDEN_SIZE", "HIDDEN_SIZE"], quote!(q), quote!(x), quote!(layer.query.weight));
    let mm_k = mm(["HIDDEN_SIZE", "HIDDEN_SIZE"], quote!(k), quote!(x), quote!(layer.key.weight));
    let mm_v = mm(["HIDDEN_SIZE", "HIDDEN_SIZE"], quote!(v), quote!(x), quote!(layer.value.weight));
    let mm_o =
        mm(["HIDDEN_SIZE", "HIDDEN_SIZE"], quote!(xb), quote!(att), quote!(layer.attention_output.weight));
    let mm_mlp =
        mm(["INTERMEDIATE_SIZE", "HIDDEN_SIZE"], quote!(mlp), quote!(x), quote!(layer.intermediate.weight));
    let mm_down =
        mm(["HIDDEN_SIZE", "INTERMEDIATE_SIZE"], quote!(xb), quote!(mlp), quote!(layer.output.weight));
    let normalize_fn = c.normalize.then(|| {
        quote! {
            /// Scales each vector to unit Euclidean length (sentence-transformers' Normalize):
            /// cosine similarity becomes a dot product.
            pub fn normalize(vectors: &mut [Vec<f32>]) {
                for vector in vectors {
                    l2_normalize::<HIDDEN_SIZE>(vector, 1);
                }
            }
        }
    });

    let n_layers = c.num_layers.to_string();
    let replacements = [("__workload_name", plan.name.as_str()), ("__n_layers", n_layers.as_str())];
    let slots = BTreeMap::from([
        ("normalize_use", normalize_use.unwrap_or_default()),
        ("pooling_use", pooling_use),
        ("embed_fn", embed_fn.unwrap_or_default()),
        ("mm_q", mm_q),
        ("mm_k", mm_k),
        ("mm_v", mm_v),
        ("mm_o", mm_o),
        ("mm_mlp", mm_mlp),
        ("mm_down", mm_down),
        ("normalize_fn", normalize_fn.unwrap_or_default()),
    ]);
    templates.fill("bert/model.rs", &replacements, &slots)
}

/// `Encoder::embed`, for a workload with pooling.
fn embed_fn(c: &BertConsts) -> Option<TokenStream> {
    let (doc_text, pool) = match c.pooling {
        Pooling::Mean => (
            "One vector per sentence: the mean of its token states ([CLS] and [SEP] included, padding excluded), as sentence-transformers' mean pooling.",
            quote! {
                for (s, ids) in part.iter().enumerate() {
                    let mut vector = vec![0.0; HIDDEN_SIZE];
                    mean_pool::<HIDDEN_SIZE>(&mut vector, &self.x[s * longest * HIDDEN_SIZE..], ids.len());
                    vectors.push(vector);
                }
            },
        ),
        Pooling::Cls => (
            "One vector per sentence: the state of its first token ([CLS]).",
            quote! {
                for s in 0..part.len() {
                    vectors.push(self.x[s * longest * HIDDEN_SIZE..][..HIDDEN_SIZE].to_vec());
                }
            },
        ),
        Pooling::None => return None,
    };
    let doc = doc(doc_text);
    Some(quote! {
        #doc
        pub fn embed<S: AsRef<[u32]>>(&mut self, batch: &[S]) -> Result<Vec<Vec<f32>>, Error> {
            let batch: Vec<&[u32]> = batch.iter().map(AsRef::as_ref).collect();
            check(&batch)?;
            let mut vectors = Vec::with_capacity(batch.len());
            for part in batch.chunks(MAX_BATCH) {
                let longest = self.forward(part);
                #pool
            }
            Ok(vectors)
        }
    })
}

/// The module doc of weights.rs: where each tensor lives, and which are copies.
fn weights_doc(name: &str, matrices: Matrices) -> [String; 2] {
    let copies = match matrices {
        Matrices::F32 => " (copied only if the file misaligns it).",
        Matrices::Packed => {
            ", except the linear layers' weights, packed at load into copies in the layout of the matmul kernel (packed.rs), and tensors it does not hold as F32 or misaligns (copied)."
        }
        Matrices::Bf16 => {
            ", except the linear layers' weights the file does not hold as BF16 (converted to bfloat16 copies), and tensors it does not hold as F32 or misaligns (copied)."
        }
        Matrices::Bf16Packed => {
            ", except the linear layers' weights, converted to bfloat16 if the file does not hold them as BF16 and packed at load into copies in the layout of the matmul kernel (bf16_tensor.rs), and tensors it does not hold as F32 or misaligns (copied)."
        }
        Matrices::Q8 => {
            ", except the linear layers' weights, quantized at load to blockwise int8 copies (q8_tensor.rs), and tensors it does not hold as F32 or misaligns (copied)."
        }
        Matrices::Q4 => {
            ", except the linear layers' weights, quantized at load to blockwise int4 copies (q4_tensor.rs), and tensors it does not hold as F32 or misaligns (copied)."
        }
        Matrices::Q8Packed => {
            ", except the linear layers' weights, quantized at load to blockwise int8 and packed into copies in the layout of the matmul kernel (q8_tensor.rs), and tensors it does not hold as F32 or misaligns (copied)."
        }
    };
    [
        format!(" The weights of `{name}`, checked against the baked shapes as they load. Each tensor"),
        format!(" is a slice of the memory-mapped model.safetensors{copies}"),
    ]
}

fn weights_rs(plan: &Plan) -> TokenStream {
    let matrices = Matrices::of(plan);
    let module_doc = weights_doc(&plan.name, matrices);
    let (matrix, load_matrix, matrix_use) = matrices.tensor();
    // (field, tensor name below `encoder.layer.N.`, rows, columns; None for a LayerNorm)
    let linears = [
        ("query", "attention.self.query", "HIDDEN_SIZE", "HIDDEN_SIZE"),
        ("key", "attention.self.key", "HIDDEN_SIZE", "HIDDEN_SIZE"),
        ("value", "attention.self.value", "HIDDEN_SIZE", "HIDDEN_SIZE"),
        ("attention_output", "attention.output.dense", "HIDDEN_SIZE", "HIDDEN_SIZE"),
        ("intermediate", "intermediate.dense", "INTERMEDIATE_SIZE", "HIDDEN_SIZE"),
        ("output", "output.dense", "HIDDEN_SIZE", "INTERMEDIATE_SIZE"),
    ];
    let norms = [("attention_norm", "attention.output.LayerNorm"), ("output_norm", "output.LayerNorm")];
    let linear_fields = linears.iter().map(|(field, hf, rows, cols)| {
        let field = format_ident!("{field}");
        let d = doc(&format!("`encoder.layer.N.{hf}`: weight [{rows}, {cols}], bias [{rows}]"));
        quote! { #d pub(crate) #field: Linear, }
    });
    let norm_fields = norms.iter().map(|(field, hf)| {
        let field = format_ident!("{field}");
        let d = doc(&format!("`encoder.layer.N.{hf}`: weight and bias [HIDDEN_SIZE]"));
        quote! { #d pub(crate) #field: Norm, }
    });
    let linear_loads = linears.iter().map(|(field, hf, rows, cols)| {
        let field = format_ident!("{field}");
        let (rows, cols) = (format_ident!("{rows}"), format_ident!("{cols}"));
        let prefix = format!("encoder.layer.{{l}}.{hf}");
        quote! { #field: Linear::load(&mut file, &format!(#prefix), #rows, #cols)?, }
    });
    let norm_loads = norms.iter().map(|(field, hf)| {
        let field = format_ident!("{field}");
        let prefix = format!("encoder.layer.{{l}}.{hf}");
        quote! { #field: Norm::load(&mut file, &format!(#prefix))?, }
    });
    let unused = ["embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias"];

    quote! {
        #(#![doc = #module_doc])*

        use std::path::Path;

        #matrix_use
        use crate::tensor_file::{Storage, Tensor, TensorFile};
        use crate::{Error, HIDDEN_SIZE, INTERMEDIATE_SIZE, MAX_POSITION_EMBEDDINGS, NUM_LAYERS, TYPE_VOCAB_SIZE, VOCAB_SIZE};

        /// Tensors of a BERT checkpoint that this encoder does not need: the position-id buffer
        /// and the classification pooler (sentence embeddings pool the token states instead).
        const UNUSED: [&str; 3] = [#(#unused),*];

        /// A linear layer: `weight` [out, in] and `bias` [out].
        pub struct Linear {
            pub(crate) weight: #matrix,
            pub(crate) bias: Tensor,
        }

        impl Linear {
            fn load(file: &mut TensorFile, prefix: &str, rows: usize, cols: usize) -> Result<Linear, Error> {
                Ok(Linear {
                    weight: file.#load_matrix(&format!("{prefix}.weight"), &[rows, cols])?,
                    bias: file.f32(&format!("{prefix}.bias"), &[rows])?,
                })
            }
        }

        /// A LayerNorm: `weight` and `bias`, [HIDDEN_SIZE] each.
        pub struct Norm {
            pub(crate) weight: Tensor,
            pub(crate) bias: Tensor,
        }

        impl Norm {
            fn load(file: &mut TensorFile, prefix: &str) -> Result<Norm, Error> {
                Ok(Norm {
                    weight: file.f32(&format!("{prefix}.weight"), &[HIDDEN_SIZE])?,
                    bias: file.f32(&format!("{prefix}.bias"), &[HIDDEN_SIZE])?,
                })
            }
        }

        /// The weights of one encoder layer.
        pub struct LayerWeights {
            #(#linear_fields)*
            #(#norm_fields)*
        }

        /// Every weight of the model.
        pub struct Weights {
            /// `embeddings.word_embeddings.weight`: [VOCAB_SIZE, HIDDEN_SIZE]
            pub(crate) word_embeddings: Tensor,
            /// `embeddings.position_embeddings.weight`: [MAX_POSITION_EMBEDDINGS, HIDDEN_SIZE]
            pub(crate) position_embeddings: Tensor,
            /// `embeddings.token_type_embeddings.weight`: [TYPE_VOCAB_SIZE, HIDDEN_SIZE]
            pub(crate) token_type_embeddings: Tensor,
            /// `embeddings.LayerNorm`: weight and bias [HIDDEN_SIZE]
            pub(crate) embeddings_norm: Norm,
            /// The encoder layers, NUM_LAYERS of them.
            pub(crate) layers: Vec<LayerWeights>,
            /// What loading noticed but did not refuse.
            warnings: Vec<String>,
            /// The memory behind every tensor above.
            _storage: Storage,
        }

        impl Weights {
            /// Maps the safetensors file at `path` and checks every tensor this model reads
            /// for its name, dtype and shape.
            pub fn load(path: &Path) -> Result<Weights, Error> {
                Weights::read(TensorFile::open(path)?)
            }

            /// Reads the safetensors file at `from` as [`Weights::load`] does, then writes `to`:
            /// a safetensors file of every tensor the model reads, each as the model holds it
            /// (see `Storage::save`).
            pub fn save(from: &Path, to: &Path) -> Result<Weights, Error> {
                let weights = Weights::read(TensorFile::open(from)?.saving())?;
                weights._storage.save(to)?;
                Ok(weights)
            }

            /// Checks and reads every tensor of `file`.
            fn read(mut file: TensorFile) -> Result<Weights, Error> {
                let word_embeddings = file.f32("embeddings.word_embeddings.weight", &[VOCAB_SIZE, HIDDEN_SIZE])?;
                let position_embeddings = file.f32("embeddings.position_embeddings.weight", &[MAX_POSITION_EMBEDDINGS, HIDDEN_SIZE])?;
                let token_type_embeddings =
                    file.f32("embeddings.token_type_embeddings.weight", &[TYPE_VOCAB_SIZE, HIDDEN_SIZE])?;
                let embeddings_norm = Norm::load(&mut file, "embeddings.LayerNorm")?;
                let mut layers = Vec::with_capacity(NUM_LAYERS);
                for l in 0..NUM_LAYERS {
                    layers.push(LayerWeights { #(#linear_loads)* #(#norm_loads)* });
                }
                let (storage, warnings) = file.finish(&UNUSED);
                Ok(Weights {
                    word_embeddings,
                    position_embeddings,
                    token_type_embeddings,
                    embeddings_norm,
                    layers,
                    warnings,
                    _storage: storage,
                })
            }

            /// What loading noticed but did not refuse (e.g. tensors this model does not use).
            pub fn warnings(&self) -> &[String] {
                &self.warnings
            }
        }
    }
}

/// src/main.rs: the command line of `main_rs`, with the `serve` subcommand where the crate serves.
fn main_file(plan: &Plan, c: &BertConsts, templates: &Templates, krate: &str) -> Result<String, Error> {
    let tokens = main_rs(plan, c);
    if c.serving.is_none() {
        return Ok(rust_source::print_tokens(tokens));
    }
    let mut file: syn::File = syn::parse2(tokens)
        .map_err(|e| Error::Template { name: "emit/bert.rs main_rs".into(), message: e.to_string() })?;
    common::add_serve_command(&mut file, templates, krate, SERVE_HELP)?;
    Ok(rust_source::print(&file))
}

fn main_rs(plan: &Plan, c: &BertConsts) -> TokenStream {
    let krate = format_ident!("{}", crate_ident(&plan.name));
    // The workload asks for normalized vectors (sentence-transformers' Normalize module):
    // they are what the binary prints unless told otherwise.
    let normalize_arg = c.normalize.then(|| {
        quote! {
            /// Print the pooled vectors as they are, without scaling each to unit length (which
            /// this model's workload asks for, so that cosine similarity is a dot product).
            #[arg(long)]
            no_normalize: bool,
        }
    });
    let (about, output_name) = match c.pooling {
        Pooling::None => ("Prints the token states of each sentence.", "token_states"),
        _ => ("Embeds sentences: one vector per sentence.", "embeddings"),
    };
    let about_doc = doc(about);
    let compute = match c.pooling {
        Pooling::None => quote! { let outputs = encoder.hidden_states(&ids)?; },
        _ => {
            let normalize = c.normalize.then(|| {
                quote! {
                    if !args.no_normalize {
                        #krate::normalize(&mut outputs);
                    }
                }
            });
            let binding = if c.normalize { quote!(let mut outputs) } else { quote!(let outputs) };
            quote! {
                #binding = encoder.embed(&ids)?;
                #normalize
            }
        }
    };
    let output_key = Literal::string(output_name);
    let c_lines = comment("one line per sentence: its values, separated by spaces");

    quote! {
        //! Command-line sentence encoding: load the model once, encode every sentence given.

        use std::io::{self, BufRead, Write};
        use std::mem::ManuallyDrop;
        use std::path::PathBuf;
        use std::process::ExitCode;
        use std::time::Instant;

        use clap::Parser;
        use serde_json::{Map, Value, json};

        use #krate::{Error, Model, Tokenizer, WORKLOAD};

        #about_doc
        #[derive(Parser)]
        #[command(version, about, long_about = None)]
        #[command(group(clap::ArgGroup::new("sentences").required(true).multiple(true).args(["text", "input", "save_model"])))]
        struct Args {
            /// Model directory holding model.safetensors and tokenizer.json.
            #[arg(long, value_name = "DIR")]
            model: PathBuf,
            /// A sentence to encode (repeat for several; an empty string is a sentence too).
            #[arg(long, value_name = "TEXT")]
            text: Vec<String>,
            /// A file of sentences, one per line (`-` reads standard input).
            #[arg(long, value_name = "FILE")]
            input: Option<PathBuf>,
            #normalize_arg
            /// Print one JSON object (the vectors, token counts and timings).
            #[arg(long)]
            json: bool,
            /// Instead of encoding, write DIR: the model directory of --model with its weights
            /// as this crate holds them in memory (e.g. quantized, for an int8 crate), which
            /// later runs load without converting them.
            #[arg(long, value_name = "DIR", conflicts_with_all = ["text", "input"])]
            save_model: Option<PathBuf>,
        }

        fn main() -> ExitCode {
            let started = Instant::now();
            let args = Args::parse();
            match run(&args, started) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(e.exit_code())
                }
            }
        }

        fn run(args: &Args, started: Instant) -> Result<(), Error> {
            let mut sentences = args.text.clone();
            if let Some(path) = &args.input {
                sentences.extend(read_lines(path)?);
            }
            if let Err(source) = std::fs::read_dir(&args.model) {
                return Err(Error::Io { path: args.model.clone(), source });
            }
            if let Some(out) = &args.save_model {
                for warning in Model::save_model(&args.model, out)? {
                    eprintln!("warning: {warning}");
                }
                let seconds = started.elapsed().as_secs_f64();
                eprintln!("wrote {} in {seconds:.2} s", out.display());
                return Ok(());
            }
            // The process ends when `run` returns, so the model and the tokenizer are never
            // freed: that would only delay the exit.
            let model = ManuallyDrop::new(Model::load(&args.model)?);
            let tokenizer = ManuallyDrop::new(Tokenizer::load(&args.model)?);
            for warning in model.warnings() {
                eprintln!("warning: {warning}");
            }
            let load_ms = started.elapsed().as_secs_f64() * 1000.0;
            let encode_start = Instant::now();
            let ids = sentences.iter().map(|s| tokenizer.encode(s)).collect::<Result<Vec<_>, _>>()?;
            let tokenize_ms = encode_start.elapsed().as_secs_f64() * 1000.0;
            let mut encoder = model.encoder();
            let run_start = Instant::now();
            #compute
            let encode_ms = run_start.elapsed().as_secs_f64() * 1000.0;

            let mut out = io::stdout().lock();
            if args.json {
                let tokens: Vec<usize> = ids.iter().map(Vec::len).collect();
                let report = Value::Object(Map::from_iter([
                    ("workload".to_string(), json!(WORKLOAD)),
                    (#output_key.to_string(), json!(outputs)),
                    ("tokens".to_string(), json!(tokens)),
                    ("load_ms".to_string(), json!(load_ms)),
                    ("tokenize_ms".to_string(), json!(tokenize_ms)),
                    ("encode_ms".to_string(), json!(encode_ms)),
                    ("sentences_per_s".to_string(), json!(sentences.len() as f64 / (encode_ms / 1000.0).max(1e-9))),
                ]));

                // A closed stdout (e.g. `| head`) is not an error worth reporting.
                let _ = writeln!(out, "{report}");
                return Ok(());
            }
            #c_lines
            for vector in &outputs {
                let line: Vec<String> = vector.iter().map(|v| format!("{v:.7}")).collect();
                if writeln!(out, "{}", line.join(" ")).is_err() {
                    return Ok(());
                }
            }
            Ok(())
        }

        /// The lines of `path` (or of standard input for `-`), without line endings.
        fn read_lines(path: &PathBuf) -> Result<Vec<String>, Error> {
            let io_error = |source| Error::Io { path: path.clone(), source };
            if path.as_os_str() == "-" {
                return io::stdin().lock().lines().collect::<Result<_, _>>().map_err(io_error);
            }
            let text = std::fs::read_to_string(path).map_err(io_error)?;
            Ok(text.lines().map(str::to_string).collect())
        }
    }
}
