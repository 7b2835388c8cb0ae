//! The Rust files of a LLaMA crate: constants, weights, the forward pass, the start-up
//! check and the kernels, plus the fixed runtime of `templates/runtime/`.

use std::collections::BTreeMap;

use proc_macro2::{Literal, TokenStream};
use quote::{format_ident, quote};

use super::common::{Matrices, doc, f32_lit, usize_lit};
use super::{Templates, common, crate_ident};
use crate::Error;
use crate::plan::{LlamaConsts, Plan};
use crate::registry::Registry;
use crate::rust_source::{self, comment};
use crate::workload::{Chat, KvDtype, RopeScaling};

/// The crates every LLaMA crate depends on (versions in templates/dependencies.toml).
const DEPENDENCIES: &[&str] =
    &["clap", "memmap2", "safetensors", "serde", "serde_json", "thiserror", "tokenizers"];

/// The crates the server of a crate that serves depends on.
const SERVING_DEPENDENCIES: &[&str] = &["axum", "futures-util", "tokio"];

/// The crates the chat template of a server that chats needs.
const CHAT_DEPENDENCIES: &[&str] = &["minijinja", "minijinja-contrib"];

/// The crates a LLaMA crate depends on, the server's included where it serves.
pub fn dependencies(c: &LlamaConsts) -> Vec<&'static str> {
    let serving = if c.serving.is_some() { SERVING_DEPENDENCIES } else { &[] };
    let chat = if chats(c) { CHAT_DEPENDENCIES } else { &[] };
    DEPENDENCIES.iter().chain(serving).chain(chat).copied().collect()
}

/// The chat template of a crate whose server answers chat completions (`serving.chat`).
fn chat(c: &LlamaConsts) -> Option<&Chat> {
    c.serving.as_ref().and_then(|s| s.chat.as_deref())
}

/// Whether the crate's server answers chat completions.
fn chats(c: &LlamaConsts) -> bool {
    chat(c).is_some()
}

/// What `serve --help` says the server is, and what its `--model` directory holds: with a
/// chat template, and without.
const SERVE_HELP: [(&str, &str); 2] = [
    (
        "Serves the model over HTTP: OpenAI's completions and chat completions API, with continuous batching.",
        "Model directory holding model.safetensors and tokenizer.json (the chat template is built in).",
    ),
    (
        "Serves the model over HTTP: OpenAI's completions API, with continuous batching.",
        "Model directory holding model.safetensors and tokenizer.json.",
    ),
];

/// The server's runtime files, copied as the others are.
const SERVING_FILES: &[&str] = &["engine.rs", "http.rs", "metrics.rs", "serve.rs"];

/// The fixed runtime files, copied through syn and prettyplease.
const RUNTIME_FILES: &[&str] = &[
    "detokenizer.rs",
    "error.rs",
    "generate.rs",
    "main.rs",
    "scratch.rs",
    "tensor_file.rs",
    "tokenizer.rs",
    "tokenizer_file.rs",
];

/// Every `.rs` file of the crate: (relative path, formatted body without header).
pub fn rust_files(
    plan: &Plan,
    c: &LlamaConsts,
    registry: &Registry,
    templates: &Templates,
) -> Result<Vec<(String, String)>, Error> {
    let krate = crate_ident(&plan.name);
    let mut files = vec![
        ("src/lib.rs".to_string(), rust_source::print_tokens(lib_rs(plan, c))),
        ("src/model.rs".to_string(), model_rs(plan, c, templates)?),
        ("src/weights.rs".to_string(), rust_source::print_tokens(weights_rs(plan, c))),
        ("src/cpu.rs".to_string(), rust_source::print_tokens(common::cpu_rs(plan))),
        ("src/kernels/mod.rs".to_string(), rust_source::print_tokens(common::kernels_mod_rs(plan))),
    ];
    let matrices = Matrices::of(plan);
    let classifier = Matrices::classifier(plan);
    let serving = if c.serving.is_some() { SERVING_FILES } else { &[] };
    let prefix_cache = c.prefix_cache_min().is_some();
    let draft_model = c.draft().is_some();
    let features = [
        ("chat", chats(c)),
        ("prefix_cache", prefix_cache),
        ("speculation", c.speculation.is_some()),
        ("prompt_lookup", c.speculation.is_some() && !draft_model),
        ("draft_model", draft_model),
        ("batched", c.batched()),
        ("cuda", false),
    ];
    let drafter: &[&str] = if draft_model { &["drafter.rs"] } else { &[] };
    for file in RUNTIME_FILES.iter().chain(serving).chain(drafter) {
        let mut source = templates.runtime(file, &krate)?;
        rust_source::select(&mut source, &features)
            .map_err(|message| Error::Template { name: format!("runtime/{file}"), message })?;
        if *file == "tensor_file.rs" {
            // The methods that neither the matrices nor a classifier of its own call.
            let unused: Vec<&str> = matrices
                .unused_tensor_file_methods()
                .iter()
                .copied()
                .filter(|m| classifier.is_none_or(|c| c.unused_tensor_file_methods().contains(m)))
                .collect();
            rust_source::remove_methods(&mut source, &unused);
        }
        // Only a session's own f32 KV cache is copied into from the scratch (see `model_rs`).
        if *file == "scratch.rs" && (c.kv_dtype == KvDtype::Bf16 || c.batched()) {
            rust_source::remove_methods(&mut source, &["like"]);
        }
        // Only a server that chats encodes a chat template's text as it is.
        if *file == "tokenizer.rs" && !chats(c) {
            rust_source::remove_methods(&mut source, &["encode_as_is"]);
        }
        if *file == "main.rs" && c.serving.is_some() {
            common::add_serve_command(&mut source, templates, &krate, SERVE_HELP[usize::from(!chats(c))])?;
        }
        files.push((format!("src/{file}"), rust_source::print(&source)));
    }
    let resident: &[&str] = if c.resident_weights { &["huge_pages.rs", "resident.rs"] } else { &[] };
    // The matrices' runtime file, a classifier's of its own, and what resident weights need.
    let held = [Some((matrices, false)), classifier.map(|m| (m, true))].into_iter().flatten();
    let held = held.filter_map(|(m, own)| Some((m.runtime_file()?, held_unused(m, own, classifier, c))));
    for (file, unused) in held.chain(resident.iter().map(|f| (*f, Vec::new()))) {
        let mut source = templates.runtime_with(file, &[("__crate", &krate)])?;
        rust_source::remove_methods(&mut source, &unused);
        files.push((format!("src/{file}"), rust_source::print(&source)));
    }
    if let Some(chat) = chat(c) {
        files.push(("src/chat_template.rs".to_string(), rust_source::print_tokens(chat_template_rs(chat))));
    }
    files.extend(common::kernel_files(plan, registry)?);
    Ok(files)
}

/// The methods of the runtime file of matrices `m` that the crate never calls: those
/// [`Matrices::unused_methods`] names, and where the classifier has an element type of its own
/// (`classifier`), what only the other side calls: the row dequantization of the embedding
/// (the classifier's where tied), and the other matrices' loader of one matrix (their loader of
/// several stays, which it calls). `own` says that `m` is the classifier's.
fn held_unused(m: Matrices, own: bool, classifier: Option<Matrices>, c: &LlamaConsts) -> Vec<&'static str> {
    let mut unused = m.unused_methods().to_vec();
    let single = match m {
        Matrices::Q8 => Some("q8"),
        Matrices::Q4 => Some("q4"),
        _ => None,
    };
    if let (Some(single), Some(_)) = (single, classifier) {
        match (own, c.tie_word_embeddings) {
            (true, false) => unused.push("dequantize_row"),
            (false, true) => unused.extend([single, "dequantize_row"]),
            (true, true) | (false, false) => {}
        }
    }
    unused
}

/// The chat template the server renders chat messages with, as the workload gives it: the
/// template's text in a raw string, which reads as the template itself.
fn chat_template_rs(chat: &Chat) -> TokenStream {
    let source = rust_source::string_literal(&chat.template);
    let (bos, eos) = (&chat.bos_token, &chat.eos_token);
    quote! {
        //! The chat template that `/v1/chat/completions` renders messages with: the workload's
        //! `serving.chat`, which `monogen init --serve` copies from the model's own template.

        /// The Jinja template, rendered with `trim_blocks` and `lstrip_blocks`.
        pub const SOURCE: &str = #source;
        /// What the template's `bos_token` stands for.
        pub const BOS_TOKEN: &str = #bos;
        /// What the template's `eos_token` stands for.
        pub const EOS_TOKEN: &str = #eos;
    }
}

fn lib_rs(plan: &Plan, c: &LlamaConsts) -> TokenStream {
    let w = plan;
    let name = &w.name;
    let features = plan.cpu_features.join(", ");
    let inner_doc: Vec<String> = [
        format!("`{name}`: a LLaMA inference crate generated by monogen."),
        String::new(),
        format!(
            "Specialized for {} layers of width {}, {} query and {} key/value heads of {}, a vocabulary of {},",
            c.num_layers, c.hidden_size, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size
        ),
        format!(
            "{} weights{}, up to {} positions, on {} {}{}. Every shape is a constant below; the",
            w.weights.dtype.as_str(),
            match c.kv_dtype {
                KvDtype::F32 => "",
                KvDtype::Bf16 => " and a bfloat16 KV cache",
            },
            c.max_seq_len,
            w.target.device.as_str(),
            w.target.arch,
            if features.is_empty() { String::new() } else { format!(" with {features}") }
        ),
        "kernels chosen for this workload are called directly from [`model`]. README.md says".into(),
        "which kernels were chosen and why.".into(),
        String::new(),
        "[`Model`] holds the weights (memory-mapped) and is shared between threads; each".into(),
        "[`Session`] owns a KV cache. [`Session::generate`] runs a prompt and samples tokens;".into(),
        "[`Session::prefill`], [`Session::decode`] and [`Session::logits_all`] expose the logits.".into(),
    ]
    .into_iter()
    .map(|l| if l.is_empty() { l } else { format!(" {l}") })
    .collect();

    let guards = common::target_guards(plan);

    let (shapes, tokens) = (shape_consts(&plan.name, c), token_consts(c));
    let window_const = c.sliding_window.map(|w| {
        let w = usize_lit(w);
        quote! {
            /// Positions each query attends to, itself included (sliding-window attention).
            pub const SLIDING_WINDOW: usize = #w;
        }
    });
    let threads = usize_lit(c.threads);
    let cpu_features = &plan.cpu_features;
    let n_features = usize_lit(cpu_features.len());
    let (bf16_mod, q8_mod) = Matrices::of(plan).modules();
    // A classifier of its own element type has its matrix type's module too (after the others').
    let (classifier_bf16_mod, classifier_q8_mod) =
        Matrices::classifier(plan).map_or((None, None), Matrices::modules);
    let batch = c.batched().then(|| {
        let max_batch = usize_lit(c.request.max_batch);
        let step_rows = usize_lit(c.step_rows);
        quote! {
            /// Sequences one batched step runs at most (`request.max_batch`).
            pub const MAX_BATCH: usize = #max_batch;
            /// Positions one batched step runs at most: a prefill chunk beside a full batch's
            /// decode rows.
            pub const STEP_ROWS: usize = #step_rows;
        }
    });
    let batch_use = c.batched().then(|| {
        quote!(
            pub use model::{Batch, Run, Sequence};
        )
    });
    let chat_mod = chats(c).then(|| {
        quote!(
            mod chat_template;
        )
    });
    let (serving_mods, serving_consts) = match &c.serving {
        None => (None, None),
        Some(s) => {
            let classes = &s.priorities;
            let n_classes = usize_lit(classes.len());
            let default = Literal::u8_unsuffixed(
                classes.iter().position(|p| *p == s.default_priority).expect("resolve checks it") as u8,
            );
            let (max_queue, kv_slots, max_body) =
                (usize_lit(s.max_queue), usize_lit(s.kv_slots), usize_lit(s.max_body_bytes));
            (
                Some(quote! {
                    #chat_mod
                    pub mod engine;
                    mod http;
                    pub mod metrics;
                    pub mod serve;
                }),
                Some(quote! {
                    /// The server's priority classes, most urgent first (`serving.priorities`).
                    pub const PRIORITIES: [&str; #n_classes] = [#(#classes),*];
                    /// The class of a request that names none, as an index of [`PRIORITIES`].
                    pub const DEFAULT_PRIORITY: u8 = #default;
                    /// Requests that may wait for a place in the batch; one more is answered 429.
                    pub const MAX_QUEUE: usize = #max_queue;
                    /// KV caches the server holds: the running sequences' and those of sequences a more
                    /// urgent request displaced (`serving.kv_slots`).
                    pub const KV_SLOTS: usize = #kv_slots;
                    /// Largest request body the server reads, in bytes.
                    pub const MAX_BODY_BYTES: usize = #max_body;
                }),
            )
        }
    };
    let prefix_const = c.prefix_cache_min().map(|min| {
        let min = usize_lit(min);
        quote! {
            /// The prefix cache: the tokens a sequence must share with what a KV cache holds for
            /// its start to be kept rather than run again (half `request.shared_prefix_len`): a
            /// server's finished requests' caches, a `Session`'s own for `generate_anew`.
            pub const PREFIX_CACHE_MIN: usize = #min;
        }
    });
    let speculation_consts = c.speculation.as_ref().map(|s| {
        let (draft, max, min) = (usize_lit(s.draft_tokens), usize_lit(s.lookup_max), usize_lit(s.lookup_min));
        let lookup = s.draft.is_none().then(|| {
            quote! {
                /// The longest n-gram of the context's end that prompt lookup looks for earlier in it.
                pub const LOOKUP_MAX: usize = #max;
                /// The shortest.
                pub const LOOKUP_MIN: usize = #min;
            }
        });
        quote! {
            /// Tokens a generation step drafts at most (`speculation.draft_tokens`): the model
            /// verifies them, with the last picked token, in one forward pass.
            pub const DRAFT_TOKENS: usize = #draft;
            #lookup
        }
    });
    let drafter_mod = c.draft().is_some().then(|| {
        quote!(
            mod drafter;
        )
    });
    let resident_mod = c.resident_weights.then(|| {
        quote!(
            mod huge_pages;
            mod resident;
        )
    });

    quote! {
        #(#![doc = #inner_doc])*

        #guards

        #bf16_mod
        #classifier_bf16_mod
        pub mod cpu;
        mod detokenizer;
        #drafter_mod
        pub mod error;
        pub mod generate;
        mod kernels;
        pub mod model;
        #q8_mod
        #classifier_q8_mod
        #resident_mod
        #serving_mods
        mod scratch;
        mod tensor_file;
        pub mod tokenizer;
        mod tokenizer_file;
        pub mod weights;

        pub use error::Error;
        pub use generate::{GenerateParams, Generation, StopReason};
        pub use model::{Model, Session};
        #batch_use
        pub use tokenizer::Tokenizer;

        #shapes
        #batch
        #prefix_const
        #speculation_consts
        #window_const
        #tokens
        /// Threads the workload allows the kernels (`target.threads`): a multi-threaded kernel
        /// splits each product into this many equal shares.
        pub const THREADS: usize = #threads;
        /// CPU features the chosen kernels were compiled for, checked by [`cpu::check`].
        pub const CPU_FEATURES: [&str; #n_features] = [#(#cpu_features),*];
        #serving_consts
    }
}

/// src/model.rs: `templates/llama/model.rs` with its slots filled from the plan. A crate that
/// batches (request.max_batch above 1) has `templates/llama/batched.rs`'s `Sequence`, `Batch`
/// and `Session` in place of model.rs's `Session`, as has a crate that serves.
/// The constants of a LLaMA crate's shapes, WORKLOAD to PREFILL_CHUNK, as every LLaMA crate
/// declares them (a CPU crate's and a CUDA crate's `lib.rs`).
pub(super) fn shape_consts(name: &str, c: &LlamaConsts) -> TokenStream {
    let dim = usize_lit(c.hidden_size);
    let hidden_dim = usize_lit(c.intermediate_size);
    let n_layers = usize_lit(c.num_layers);
    let n_heads = usize_lit(c.num_heads);
    let n_kv_heads = usize_lit(c.num_kv_heads);
    let head_dim = usize_lit(c.head_dim);
    let vocab_size = usize_lit(c.vocab_size);
    let max_seq_len = usize_lit(c.max_seq_len);
    let prefill_chunk = usize_lit(c.prefill_chunk);
    quote! {
    /// The workload this crate was generated from.
    pub const WORKLOAD: &str = #name;
    /// Width of the residual stream (`hidden_size`).
    pub const HIDDEN_SIZE: usize = #dim;
    /// Width of the MLP's gate and up projections (`intermediate_size`).
    pub const INTERMEDIATE_SIZE: usize = #hidden_dim;
    /// Decoder layers.
    pub const NUM_LAYERS: usize = #n_layers;
    /// Query heads.
    pub const NUM_HEADS: usize = #n_heads;
    /// Key/value heads; NUM_HEADS / NUM_KV_HEADS query heads share each one.
    pub const NUM_KV_HEADS: usize = #n_kv_heads;
    /// Width of one attention head.
    pub const HEAD_DIM: usize = #head_dim;
    /// Width of all query heads together.
    pub const Q_DIM: usize = NUM_HEADS * HEAD_DIM;
    /// Width of all key (or value) heads together.
    pub const KV_DIM: usize = NUM_KV_HEADS * HEAD_DIM;
    /// Rows of the embedding and of the classifier.
    pub const VOCAB_SIZE: usize = #vocab_size;
    /// Positions one session holds: prompt and generated tokens together (`request.max_seq_len`).
    pub const MAX_SEQ_LEN: usize = #max_seq_len;
    /// Positions run through the layers at once during prefill (`request.typical_prompt_len`).
    pub const PREFILL_CHUNK: usize = #prefill_chunk;
    }
}

/// The constants of the rotary embedding, the norms and the special tokens, ROPE_THETA to
/// EOS_TOKEN_IDS, as every LLaMA crate declares them.
pub(super) fn token_consts(c: &LlamaConsts) -> TokenStream {
    let rope_theta = f32_lit(c.rope_theta);
    let rms_norm_eps = f32_lit(c.rms_norm_eps);
    let bos_id = Literal::u32_unsuffixed(c.bos_token_id);
    let eos_ids = c.eos_token_ids.iter().map(|&id| Literal::u32_unsuffixed(id));
    let n_eos = usize_lit(c.eos_token_ids.len());
    quote! {
    /// Base of the rotary embedding's frequencies.
    pub const ROPE_THETA: f32 = #rope_theta;
    /// Epsilon of every RMSNorm.
    pub const RMS_NORM_EPS: f32 = #rms_norm_eps;
    /// The token that starts a sequence.
    pub const BOS_TOKEN_ID: u32 = #bos_id;
    /// The tokens that end generation.
    pub const EOS_TOKEN_IDS: [u32; #n_eos] = [#(#eos_ids),*];
    }
}

fn model_rs(plan: &Plan, c: &LlamaConsts, templates: &Templates) -> Result<String, Error> {
    let matrices = Matrices::of(plan);
    let classifier = Matrices::classifier(plan);
    let batched = c.batched();
    let (rope_use, rope_tables, inv_freq_fn) = rope_parts(c.rope_scaling);
    let mut slots =
        BTreeMap::from([("rope_use", rope_use), ("rope_tables", rope_tables), ("inv_freq_fn", inv_freq_fn)]);
    // Tied embeddings held as the classifier is, where it has an element type of its own.
    let embedding = classifier.filter(|_| c.tie_word_embeddings).unwrap_or(matrices);
    slots.extend(embedding_slots(embedding));
    slots.extend(product_slots(c, matrices, classifier.zip(plan.weights.classifier()), batched));
    slots.extend(attention_slots(c));
    let n_layers = c.num_layers.to_string();
    let replacements = [("__workload_name", plan.name.as_str()), ("__n_layers", n_layers.as_str())];
    let mut file = templates.rust("llama/model.rs", &replacements)?;
    rust_source::select(&mut file, &model_features(c))
        .map_err(|message| Error::Template { name: "llama/model.rs".into(), message })?;
    if !batched {
        return Templates::fill_file("llama/model.rs", file, &slots);
    }
    // The batch's buffers are not tied to one sequence's cache.
    slots.remove("new_keys");
    slots.remove("new_values");
    // A prefix cache copies a kept start layer by layer: a bfloat16 cache's values
    // widen exactly to f32, which `store` rounds back to themselves.
    if c.prefix_cache_min().is_some() {
        let copy_layer = match c.kv_dtype {
            KvDtype::F32 => quote!(to.store(0, from.keys(len), from.values(len));),
            KvDtype::Bf16 => quote! {
                let widen = |bits: &[u16]| -> Vec<f32> { bits.iter().map(|&b| f32::from_bits(u32::from(b) << 16)).collect() };
                to.store(0, &widen(from.keys(len)), &widen(from.values(len)));
            },
        };
        slots.insert("copy_layer", copy_layer);
    }
    let session = |item: &syn::Item| match item {
        syn::Item::Struct(s) => s.ident == "Session",
        syn::Item::Impl(i) => {
            matches!(&*i.self_ty, syn::Type::Path(p) if p.path.segments.last().is_some_and(|s| s.ident == "Session"))
        }
        _ => false,
    };
    let at = file.items.iter().position(session).ok_or_else(|| Error::Template {
        name: "llama/model.rs".into(),
        message: "no `Session` to put the batched one in place of".into(),
    })?;
    file.items.retain(|item| !session(item));
    let mut batched_file = templates.rust("llama/batched.rs", &replacements)?;
    rust_source::select(&mut batched_file, &model_features(c))
        .map_err(|message| Error::Template { name: "llama/batched.rs".into(), message })?;
    let (uses, items): (Vec<syn::Item>, Vec<syn::Item>) =
        batched_file.items.into_iter().partition(|item| matches!(item, syn::Item::Use(_)));
    file.items.splice(at..at, items);
    let last_use = file.items.iter().rposition(|item| matches!(item, syn::Item::Use(_))).map_or(0, |i| i + 1);
    file.items.splice(last_use..last_use, uses);
    Templates::fill_file("llama/batched.rs", file, &slots)
}

/// The conditions of model.rs's `#[only_if(..)]` parts.
/// `rewind` only where something rewinds a session: speculation, or the prefix cache.
/// `rewind` also in a draft model's crate, whose drafter rewinds it.
fn model_features(c: &LlamaConsts) -> [(&'static str, bool); 4] {
    let (speculation, prefix_cache) = (c.speculation.is_some(), c.prefix_cache_min().is_some());
    [
        ("speculation", speculation),
        ("prefix_cache", prefix_cache),
        ("rewind", speculation || prefix_cache || c.drafts),
        ("draft_model", c.draft().is_some()),
    ]
}

/// How a token's embedding row enters the residual stream: copied (f32), widened (bfloat16)
/// or dequantized (int8).
fn embedding_slots(matrices: Matrices) -> [(&'static str, TokenStream); 2] {
    let (embed_row, widen_fn) = match matrices {
        Matrices::Bf16 | Matrices::Bf16Packed => (
            quote!(widen(&mut x[row * HIDDEN_SIZE..(row + 1) * HIDDEN_SIZE], &w.embed_tokens[token * HIDDEN_SIZE..(token + 1) * HIDDEN_SIZE]);),
            quote! {
                /// Widens bfloat16 values to f32 (a bfloat16 is the high half of an f32).
                fn widen(out: &mut [f32], values: &[u16]) {
                    for (o, &v) in out.iter_mut().zip(values) {
                        *o = f32::from_bits(u32::from(v) << 16);
                    }
                }
            },
        ),
        Matrices::Q8 | Matrices::Q8Packed | Matrices::Q4 => (
            quote!(w.embed_tokens.dequantize_row(token, &mut x[row * HIDDEN_SIZE..(row + 1) * HIDDEN_SIZE]);),
            quote!(),
        ),
        Matrices::F32 | Matrices::Packed => (
            quote!(x[row * HIDDEN_SIZE..(row + 1) * HIDDEN_SIZE].copy_from_slice(&w.embed_tokens[token * HIDDEN_SIZE..(token + 1) * HIDDEN_SIZE]);),
            quote!(),
        ),
    };
    [("embed_row", embed_row), ("widen_fn", widen_fn)]
}

/// The linear layers' products with the crate's matmul (and the biases of a model whose q, k
/// and v projections have them), and the classifier.
/// With `batched`, the classifier runs the N rows of a batched step's last positions.
/// A crate that speculates also classifies the T rows of a verification at once.
/// A classifier of its own element type (`own_classifier`: how it is held, and its dtype) runs
/// through its own matmul, `kernels::matmul_classifier`.
fn product_slots(
    c: &LlamaConsts,
    matrices: Matrices,
    own_classifier: Option<(Matrices, crate::workload::Dtype)>,
    batched: bool,
) -> Vec<(&'static str, TokenStream)> {
    let mm = |shape: [&str; 2], out: TokenStream, x: TokenStream, w: TokenStream| {
        matrices.matmul_call(shape, out, x, w, quote!(t))
    };
    let mm_q = mm(["Q_DIM", "HIDDEN_SIZE"], quote!(q), quote!(xb), quote!(layer.q_proj));
    let mm_k = mm(["KV_DIM", "HIDDEN_SIZE"], quote!(k), quote!(xb), quote!(layer.k_proj));
    let mm_v = mm(["KV_DIM", "HIDDEN_SIZE"], quote!(v), quote!(xb), quote!(layer.v_proj));
    let mm_o = mm(["HIDDEN_SIZE", "Q_DIM"], quote!(xb), quote!(att), quote!(layer.o_proj));
    let mm_gate = mm(["INTERMEDIATE_SIZE", "HIDDEN_SIZE"], quote!(gate), quote!(xb), quote!(layer.gate_proj));
    let mm_up = mm(["INTERMEDIATE_SIZE", "HIDDEN_SIZE"], quote!(up), quote!(xb), quote!(layer.up_proj));
    let mm_down = mm(["HIDDEN_SIZE", "INTERMEDIATE_SIZE"], quote!(xb), quote!(gate), quote!(layer.down_proj));
    let (rows, shape) = if batched { (quote!(n), "[N, VOCAB_SIZE]") } else { (quote!(1), "[VOCAB_SIZE]") };
    let held = own_classifier.map_or(String::new(), |(_, dtype)| format!(", held in {}", dtype.as_str()));
    let (classifier, classifier_comment) = if c.tie_word_embeddings && own_classifier.is_some() {
        (
            quote!(w.embed_tokens),
            format!(
                "logits = xb · embed_tokensᵀ (tied embeddings: the embedding matrix is the classifier{held}): {shape}"
            ),
        )
    } else if c.tie_word_embeddings && matrices.packed() {
        (
            quote!(w.classifier),
            format!(
                "logits = xb · embed_tokensᵀ (tied embeddings: the embedding matrix is the classifier, packed): {shape}"
            ),
        )
    } else if c.tie_word_embeddings {
        (
            quote!(w.embed_tokens),
            format!(
                "logits = xb · embed_tokensᵀ (tied embeddings: the embedding matrix is the classifier): {shape}"
            ),
        )
    } else {
        (quote!(w.lm_head), format!("logits = xb · lm_headᵀ{held}: {shape}"))
    };
    let classifier_comment_text = classifier_comment.clone();
    let classifier_comment = comment(&classifier_comment);
    let (classifier_matrices, classifier_fn) = match own_classifier {
        Some((m, _)) => (m, quote!(crate::kernels::matmul_classifier::matmul)),
        None => (matrices, quote!(matmul)),
    };
    let mm_classifier = classifier_matrices.matmul_call_with(
        classifier_fn.clone(),
        ["VOCAB_SIZE", "HIDDEN_SIZE"],
        quote!(logits),
        quote!(xb),
        classifier.clone(),
        rows,
    );
    // A batched crate's Session verifies through `Batch::step_rows`, with the classifier above.
    let verify_slots = (c.speculation.is_some() && !batched).then(|| {
        let comment_rows = comment(&classifier_comment_text.replace(shape, "[T, VOCAB_SIZE]"));
        let call = classifier_matrices.matmul_call_with(
            classifier_fn,
            ["VOCAB_SIZE", "HIDDEN_SIZE"],
            quote!(logits),
            quote!(xb),
            classifier,
            quote!(t),
        );
        [("c_classifier_rows", comment_rows), ("mm_classifier_rows", call)]
    });

    let (c_q, c_kv) = if c.qkv_bias {
        (
            comment("q = xb · q_projᵀ + q_proj.bias: [T, Q_DIM]"),
            comment("k = xb · k_projᵀ + k_proj.bias, v = xb · v_projᵀ + v_proj.bias: [T, KV_DIM]"),
        )
    } else {
        (comment("q = xb · q_projᵀ: [T, Q_DIM]"), comment("k = xb · k_projᵀ, v = xb · v_projᵀ: [T, KV_DIM]"))
    };
    let (q_bias, k_bias, v_bias, add_bias_fn) = if c.qkv_bias {
        (
            quote!(add_bias(q, &layer.q_bias);),
            quote!(add_bias(k, &layer.k_bias);),
            quote!(add_bias(v, &layer.v_bias);),
            quote! {
                /// Adds `bias` to every row of `x`.
                fn add_bias(x: &mut [f32], bias: &[f32]) {
                    for row in x.chunks_exact_mut(bias.len()) {
                        for (a, b) in row.iter_mut().zip(bias) {
                            *a += *b;
                        }
                    }
                }
            },
        )
    } else {
        (quote!(), quote!(), quote!(), quote!())
    };
    [
        ("c_q", c_q),
        ("mm_q", mm_q),
        ("q_bias", q_bias),
        ("c_kv", c_kv),
        ("mm_k", mm_k),
        ("k_bias", k_bias),
        ("mm_v", mm_v),
        ("v_bias", v_bias),
        ("mm_o", mm_o),
        ("mm_gate", mm_gate),
        ("mm_up", mm_up),
        ("mm_down", mm_down),
        ("c_classifier", classifier_comment),
        ("mm_classifier", mm_classifier),
        ("add_bias_fn", add_bias_fn),
    ]
    .into_iter()
    .chain(verify_slots.into_iter().flatten())
    .collect()
}

/// The KV cache's element type and the attention over it: full (decode and prefill kernels) or
/// through a sliding window (the decode kernel, row by row).
fn attention_slots(c: &LlamaConsts) -> [(&'static str, TokenStream); 7] {
    let window_use = c.sliding_window.map(|_| {
        quote!(
            use crate::SLIDING_WINDOW;
        )
    });
    let (decode, prefill) = (format_ident!("attention_decode"), format_ident!("attention_prefill"));
    // An f32 cache copies the new keys and values in (`memcpy`): they start where its storage
    // does within a page (runtime/scratch.rs says why). A bfloat16 cache converts them.
    let (new_keys, new_values) = match c.kv_dtype {
        KvDtype::F32 => (
            quote!(Room::like(PREFILL_CHUNK * KV_DIM, kv[0].keys(0))),
            quote!(Room::like(PREFILL_CHUNK * KV_DIM, kv[0].values(0))),
        ),
        KvDtype::Bf16 => {
            (quote!(Room::new(PREFILL_CHUNK * KV_DIM)), quote!(Room::new(PREFILL_CHUNK * KV_DIM)))
        }
    };
    let (prefill_use, attention, c_att) = match c.sliding_window {
        None => (
            quote!(
                use crate::kernels::#prefill::#prefill;
            ),
            quote! {
                let (keys, values) = (cache.keys(start + t), cache.values(start + t));
                if t == 1 {
                    #decode::<NUM_HEADS, NUM_KV_HEADS, HEAD_DIM>(att, q, keys, values, scores);
                } else {
                    #prefill::<NUM_HEADS, NUM_KV_HEADS, HEAD_DIM>(att, q, keys, values, scores, start, t);
                }
            },
            comment("att = softmax(q · kᵀ / √HEAD_DIM) · v, each row over positions 0..=its own: [T, Q_DIM]"),
        ),
        Some(_) => (
            quote!(),
            quote! {
                for r in 0..t {
                    let end = start + r + 1;
                    let from = end.saturating_sub(SLIDING_WINDOW) * KV_DIM;
                    let (keys, values) = (&cache.keys(end)[from..], &cache.values(end)[from..]);
                    let (q_row, att_row) = (&q[r * Q_DIM..(r + 1) * Q_DIM], &mut att[r * Q_DIM..(r + 1) * Q_DIM]);
                    #decode::<NUM_HEADS, NUM_KV_HEADS, HEAD_DIM>(att_row, q_row, keys, values, scores);
                }
            },
            comment(
                "att = softmax(q · kᵀ / √HEAD_DIM) · v, each row over the SLIDING_WINDOW positions up to its own: [T, Q_DIM]",
            ),
        ),
    };
    let c_store = match c.kv_dtype {
        KvDtype::F32 => comment("append k and v to this layer's cache: it now holds positions 0..start + T"),
        KvDtype::Bf16 => comment(
            "append k and v, rounded to bfloat16, to this layer's cache: it now holds positions 0..start + T",
        ),
    };

    [
        ("prefill_use", prefill_use),
        ("window_use", window_use.unwrap_or_default()),
        ("new_keys", new_keys),
        ("new_values", new_values),
        ("c_store", c_store),
        ("c_att", c_att),
        ("attention", attention),
    ]
}

fn weights_rs(plan: &Plan, c: &LlamaConsts) -> TokenStream {
    // The matrices' type and loader: f32 slices, or bfloat16 ones for a bf16 workload (the
    // norms and biases stay f32).
    let matrices = Matrices::of(plan);
    // Large weights are copied into anonymous memory at load (see resident.rs), where the file
    // holds the matrices as the crate keeps them.
    let resident = c.resident_weights.then(|| {
        let dtype = match matrices {
            Matrices::Bf16 | Matrices::Bf16Packed => format_ident!("BF16"),
            Matrices::F32 | Matrices::Packed => format_ident!("F32"),
            Matrices::Q8 | Matrices::Q8Packed | Matrices::Q4 => {
                unreachable!("int8 and int4 matrices are never resident (resolve::resolve)")
            }
        };
        quote!(.resident(safetensors::Dtype::#dtype)?)
    });
    let (matrix, load_matrix, matrix_use) = matrices.tensor();
    // A classifier of its own element type: its type, loader and `use` (none where it is the
    // matrices' type).
    let own = Matrices::classifier(plan).map(|m| {
        let (t, load, using) = m.tensor();
        let using = (t.to_string() != matrix.to_string()).then_some(using);
        (t, load, using)
    });
    let classifier_use = own.as_ref().and_then(|(_, _, using)| using.clone());
    // Packed matrices serve the products only: the embedding rows stay in the file's layout,
    // and a tied classifier gets a packed copy of them. Tied embeddings held as a classifier of
    // their own element type serve both.
    let (embed_matrix, load_embed) = match (matrices, &own) {
        (_, Some((t, load, _))) if c.tie_word_embeddings => (t.clone(), load.clone()),
        (Matrices::Packed, _) => (quote!(Tensor), format_ident!("f32")),
        (Matrices::Bf16Packed, _) => (matrix.clone(), format_ident!("bf16")),
        (Matrices::Q8Packed, _) => (matrix.clone(), format_ident!("q8")),
        _ => (matrix.clone(), load_matrix.clone()),
    };
    let module_doc = weights_doc(plan, c);
    let (classifier_matrix, load_classifier) =
        own.as_ref().map_or((&matrix, &load_matrix), |(t, load, _)| (t, load));
    let (embed_doc, lm_head_field, lm_head_load, lm_head_init) =
        classifier_parts(c, matrices.packed() && own.is_none(), classifier_matrix, load_classifier);
    let LayerParts { fields, loads, layer_matrices, bias_fields, bias_loads } =
        layer_parts(c, matrices, &matrix, &load_matrix);

    quote! {
        #(#![doc = #module_doc])*

        use std::path::Path;

        #matrix_use
        #classifier_use
        use crate::tensor_file::{Storage, Tensor, TensorFile};
        use crate::{Error, HIDDEN_SIZE, INTERMEDIATE_SIZE, KV_DIM, NUM_LAYERS, Q_DIM, VOCAB_SIZE};

        /// The weights of one decoder layer.
        pub struct LayerWeights {
            #(#fields)*
            #bias_fields
        }

        /// Every weight of the model.
        pub struct Weights {
            #embed_doc
            pub(crate) embed_tokens: #embed_matrix,
            /// The decoder layers, NUM_LAYERS of them.
            pub(crate) layers: Vec<LayerWeights>,
            /// `model.norm.weight`: [HIDDEN_SIZE]
            pub(crate) norm: Tensor,
            #lm_head_field
            /// What loading noticed but did not refuse.
            warnings: Vec<String>,
            /// The memory behind every tensor above.
            _storage: Storage,
        }

        impl Weights {
            /// Maps the safetensors file at `path` and checks every tensor this model reads
            /// for its name, dtype and shape.
            pub fn load(path: &Path) -> Result<Weights, Error> {
                Weights::read(TensorFile::open(path)? #resident)
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
                let embed_tokens = file.#load_embed("model.embed_tokens.weight", &[VOCAB_SIZE, HIDDEN_SIZE])?;
                let mut layers = Vec::with_capacity(NUM_LAYERS);
                for l in 0..NUM_LAYERS {
                    #layer_matrices
                    layers.push(LayerWeights { #(#loads)* #bias_loads });
                }
                let norm = file.f32("model.norm.weight", &[HIDDEN_SIZE])?;
                #lm_head_load
                let (storage, warnings) = file.finish(&[]);
                Ok(Weights { embed_tokens, layers, norm, #lm_head_init warnings, _storage: storage })
            }

            /// What loading noticed but did not refuse (e.g. tensors this model does not use).
            pub fn warnings(&self) -> &[String] {
                &self.warnings
            }
        }
    }
}

/// The module doc of weights.rs: where each tensor lives, and which are copies.
fn weights_doc(plan: &Plan, c: &LlamaConsts) -> Vec<String> {
    let name = &plan.name;
    let source = if c.resident_weights {
        " is a slice of model.safetensors, which is copied into memory at load if it holds the matrices as this crate keeps them (resident.rs),"
    } else {
        " is a slice of the memory-mapped model.safetensors,"
    };
    let copies = match Matrices::of(plan) {
        Matrices::Bf16 => {
            " except matrices the file does not hold as BF16 (converted to bfloat16 copies) and norms or biases it does not hold as F32 (widened to f32 copies)."
        }
        Matrices::Q8 => {
            " except the matrices, quantized at load to blockwise int8 copies (q8_tensor.rs), and norms or biases the file does not hold as F32 (widened to f32 copies)."
        }
        Matrices::Q4 => {
            " except the matrices, quantized at load to blockwise int4 copies (q4_tensor.rs), and norms or biases the file does not hold as F32 (widened to f32 copies)."
        }
        Matrices::Q8Packed => {
            " except the matrices, quantized at load to blockwise int8 and packed into copies in the layout of the matmul kernel (q8_tensor.rs), the embedding rows (quantized to int8 copies), and norms or biases the file does not hold as F32 (widened to f32 copies)."
        }
        Matrices::F32 => {
            " except a tensor the file misaligns or holds as BF16 or F16, which is copied (widened to f32)."
        }
        Matrices::Packed => {
            " except the matrices, packed at load into copies in the layout of the matmul kernel (packed.rs), and a tensor the file misaligns or holds as BF16 or F16, which is copied (widened to f32)."
        }
        Matrices::Bf16Packed => {
            " except the matrices, converted to bfloat16 if the file does not hold them as BF16 and packed at load into copies in the layout of the matmul kernel (bf16_tensor.rs), the embedding rows if the file does not hold them as BF16 (converted to a bfloat16 copy), and norms or biases it does not hold as F32 (widened to f32 copies)."
        }
    };
    let own_classifier = Matrices::classifier(plan).map(|m| {
        let what = if c.tie_word_embeddings {
            "The classifier (the tied embedding matrix)"
        } else {
            "The classifier (`lm_head`)"
        };
        let how = match m {
            Matrices::Q8 | Matrices::Q8Packed => "quantized at load to a blockwise int8 copy (q8_tensor.rs)",
            Matrices::Q4 => "quantized at load to a blockwise int4 copy (q4_tensor.rs)",
            Matrices::Bf16 | Matrices::Bf16Packed => "bfloat16 (bf16_tensor.rs)",
            Matrices::F32 | Matrices::Packed => "f32",
        };
        format!(" {what} is held apart from the other matrices: {how}, for its own matmul.")
    });
    [
        format!(" The weights of `{name}`, checked against the baked shapes as they load. Each tensor"),
        format!("{source}{copies}"),
    ]
    .into_iter()
    .chain(own_classifier)
    .collect()
}

/// The embedding's doc, and the classifier's field, load and initializer: none with tied
/// embeddings, a packed copy of the embedding where the classifier's matrix is `packed`,
/// `lm_head` else. `matrix` and `load_matrix` are the classifier's type and loader.
fn classifier_parts(
    c: &LlamaConsts,
    packed: bool,
    matrix: &TokenStream,
    load_matrix: &proc_macro2::Ident,
) -> (TokenStream, TokenStream, TokenStream, TokenStream) {
    let embed_doc = if c.tie_word_embeddings && packed {
        doc(
            "`model.embed_tokens.weight`: [VOCAB_SIZE, HIDDEN_SIZE]; the classifier too (tied embeddings), packed apart.",
        )
    } else if c.tie_word_embeddings {
        doc("`model.embed_tokens.weight`: [VOCAB_SIZE, HIDDEN_SIZE]; also the classifier (tied embeddings).")
    } else {
        doc("`model.embed_tokens.weight`: [VOCAB_SIZE, HIDDEN_SIZE]")
    };
    let (lm_head_field, lm_head_load, lm_head_init) = if c.tie_word_embeddings && packed {
        (
            quote! {
                /// `model.embed_tokens.weight` packed for the matmul kernel: the classifier.
                pub(crate) classifier: #matrix,
            },
            quote! { let classifier = file.#load_matrix("model.embed_tokens.weight", &[VOCAB_SIZE, HIDDEN_SIZE])?; },
            quote! { classifier, },
        )
    } else if c.tie_word_embeddings {
        (quote!(), quote!(), quote!())
    } else {
        (
            quote! {
                /// `lm_head.weight`: [VOCAB_SIZE, HIDDEN_SIZE]
                pub(crate) lm_head: #matrix,
            },
            quote! { let lm_head = file.#load_matrix("lm_head.weight", &[VOCAB_SIZE, HIDDEN_SIZE])?; },
            quote! { lm_head, },
        )
    };

    (embed_doc, lm_head_field, lm_head_load, lm_head_init)
}

/// A decoder layer's fields and loads in weights.rs.
struct LayerParts {
    fields: Vec<TokenStream>,
    loads: Vec<TokenStream>,
    /// An int8 crate's quantization of a layer's matrices together, before the layer is built.
    layer_matrices: Option<TokenStream>,
    bias_fields: TokenStream,
    bias_loads: TokenStream,
}

/// The fields of `LayerWeights` and how `Weights::read` fills them.
fn layer_parts(
    c: &LlamaConsts,
    matrices: Matrices,
    matrix: &TokenStream,
    load_matrix: &proc_macro2::Ident,
) -> LayerParts {
    struct LayerTensor {
        field: &'static str,
        hf: &'static str,
        shape: (&'static str, Option<&'static str>),
    }
    let tensors = [
        LayerTensor { field: "input_layernorm", hf: "input_layernorm", shape: ("HIDDEN_SIZE", None) },
        LayerTensor { field: "q_proj", hf: "self_attn.q_proj", shape: ("Q_DIM", Some("HIDDEN_SIZE")) },
        LayerTensor { field: "k_proj", hf: "self_attn.k_proj", shape: ("KV_DIM", Some("HIDDEN_SIZE")) },
        LayerTensor { field: "v_proj", hf: "self_attn.v_proj", shape: ("KV_DIM", Some("HIDDEN_SIZE")) },
        LayerTensor { field: "o_proj", hf: "self_attn.o_proj", shape: ("HIDDEN_SIZE", Some("Q_DIM")) },
        LayerTensor {
            field: "post_attention_layernorm",
            hf: "post_attention_layernorm",
            shape: ("HIDDEN_SIZE", None),
        },
        LayerTensor {
            field: "gate_proj",
            hf: "mlp.gate_proj",
            shape: ("INTERMEDIATE_SIZE", Some("HIDDEN_SIZE")),
        },
        LayerTensor {
            field: "up_proj",
            hf: "mlp.up_proj",
            shape: ("INTERMEDIATE_SIZE", Some("HIDDEN_SIZE")),
        },
        LayerTensor {
            field: "down_proj",
            hf: "mlp.down_proj",
            shape: ("HIDDEN_SIZE", Some("INTERMEDIATE_SIZE")),
        },
    ];
    let fields = tensors.iter().map(|t| {
        let field = format_ident!("{}", t.field);
        let shape_text = match t.shape.1 {
            Some(cols) => format!("[{}, {cols}]", t.shape.0),
            None => format!("[{}]", t.shape.0),
        };
        let field_doc = doc(&format!("`model.layers.N.{}.weight`: {shape_text}", t.hf));
        let ty = if t.shape.1.is_some() { matrix.clone() } else { quote!(Tensor) };
        quote! { #field_doc pub(crate) #field: #ty, }
    });
    // An int8 crate quantizes a layer's matrices together (`TensorFile::q8_many`: one start of
    // the other threads for all seven); every other tensor loads where its field is set.
    let together = matches!(matrices, Matrices::Q8 | Matrices::Q8Packed | Matrices::Q4);
    let many = format_ident!("{load_matrix}_many");
    let loads = tensors.iter().map(|t| {
        let field = format_ident!("{}", t.field);
        let hf = t.hf;
        let rows = format_ident!("{}", t.shape.0);
        let shape = match t.shape.1 {
            Some(cols) => {
                let cols = format_ident!("{}", cols);
                quote!(&[#rows, #cols])
            }
            None => quote!(&[#rows]),
        };
        let tensor_name = format!("model.layers.{{l}}.{hf}.weight");
        match t.shape.1 {
            Some(_) if together => quote! { #field, },
            Some(_) => quote! { #field: file.#load_matrix(&format!(#tensor_name), #shape)?, },
            None => quote! { #field: file.f32(&format!(#tensor_name), #shape)?, },
        }
    });
    let layer_matrices = together.then(|| {
        let (fields, entries): (Vec<_>, Vec<_>) = tensors
            .iter()
            .filter_map(|t| {
                let cols = format_ident!("{}", t.shape.1?);
                let (field, rows, hf) = (format_ident!("{}", t.field), format_ident!("{}", t.shape.0), t.hf);
                let tensor_name = format!("model.layers.{{l}}.{hf}.weight");
                Some((field, quote!((&format!(#tensor_name), [#rows, #cols]))))
            })
            .unzip();
        quote! { let [#(#fields),*] = file.#many([#(#entries),*])?; }
    });

    let (bias_fields, bias_loads) = if c.qkv_bias {
        (
            quote! {
                /// `model.layers.N.self_attn.q_proj.bias`: [Q_DIM]
                pub(crate) q_bias: Tensor,
                /// `model.layers.N.self_attn.k_proj.bias`: [KV_DIM]
                pub(crate) k_bias: Tensor,
                /// `model.layers.N.self_attn.v_proj.bias`: [KV_DIM]
                pub(crate) v_bias: Tensor,
            },
            quote! {
                q_bias: file.f32(&format!("model.layers.{l}.self_attn.q_proj.bias"), &[Q_DIM])?,
                k_bias: file.f32(&format!("model.layers.{l}.self_attn.k_proj.bias"), &[KV_DIM])?,
                v_bias: file.f32(&format!("model.layers.{l}.self_attn.v_proj.bias"), &[KV_DIM])?,
            },
        )
    } else {
        (quote!(), quote!())
    };

    LayerParts { fields: fields.collect(), loads: loads.collect(), layer_matrices, bias_fields, bias_loads }
}

/// How `Model::load` builds the rotary tables: from `ROPE_THETA` alone, or, with rope scaling,
/// from inverse frequencies that a generated `rope_inv_freq` scales with the workload's
/// constants. Returns the `use` line, the statement and the function (if any).
pub(super) fn rope_parts(scaling: Option<RopeScaling>) -> (TokenStream, TokenStream, TokenStream) {
    let Some(scaling) = scaling else {
        return (
            quote!(
                use crate::kernels::rope::{rope, rope_table};
            ),
            quote!(let (rope_cos, rope_sin) = rope_table::<HEAD_DIM>(ROPE_THETA, MAX_SEQ_LEN);),
            quote!(),
        );
    };
    let unscaled = quote! {
        let mut inv_freq: Vec<f32> =
            (0..HEAD_DIM / 2).map(|i| 1.0 / ROPE_THETA.powf((2 * i) as f32 / HEAD_DIM as f32)).collect();
    };
    let body = match scaling {
        RopeScaling::Linear { factor } => {
            let factor = f32_lit(factor as f32);
            let doc = doc("The rotary inverse frequencies, divided by the linear rope-scaling factor.");
            quote! {
                #doc
                fn rope_inv_freq() -> Vec<f32> {
                    #unscaled
                    for f in &mut inv_freq {
                        *f /= #factor;
                    }
                    inv_freq
                }
            }
        }
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => {
            let [factor, low, high, original] =
                [factor, low_freq_factor, high_freq_factor, original_max_position_embeddings as f64]
                    .map(|v| f32_lit(v as f32));
            let doc = doc(
                "The rotary inverse frequencies with Llama 3.1's rope scaling: wavelengths longer than\nORIGINAL / LOW are divided by FACTOR, shorter than ORIGINAL / HIGH kept, and those\nbetween interpolated (computed in f32, as transformers does).",
            );
            quote! {
                #doc
                fn rope_inv_freq() -> Vec<f32> {
                    const FACTOR: f32 = #factor;
                    const LOW: f32 = #low;
                    const HIGH: f32 = #high;
                    const ORIGINAL: f32 = #original;
                    #unscaled
                    for f in &mut inv_freq {
                        let wavelen = 2.0 * std::f32::consts::PI / *f;
                        if wavelen > ORIGINAL / LOW {
                            *f /= FACTOR;
                        } else if wavelen >= ORIGINAL / HIGH {
                            let smooth = (ORIGINAL / wavelen - LOW) / (HIGH - LOW);
                            *f = (1.0 - smooth) * *f / FACTOR + smooth * *f;
                        }
                    }
                    inv_freq
                }
            }
        }
    };
    (
        quote!(
            use crate::kernels::rope::{rope, rope_table_from};
        ),
        quote!(let (rope_cos, rope_sin) = rope_table_from::<HEAD_DIM>(&rope_inv_freq(), MAX_SEQ_LEN);),
        body,
    )
}
