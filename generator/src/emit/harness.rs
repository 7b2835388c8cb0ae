//! The benchmark harness of a workload: a generated crate that holds every competing
//! implementation of every interface it times (see [`timed`]) and each one's reference, checks
//! each against the reference at the workload's shapes, then times them.
//!
//! Like the crates `build` writes, it is monomorphized: the shapes are consts, every
//! candidate is a unit struct implementing its interface's trait (`Matmul` of
//! `templates/bench/harness.rs`, the others of the architecture's `templates/bench/llama.rs`
//! or `bert.rs`), and `main` calls each one by name. `monogen bench` builds it with the
//! profile [`crate::rankings::BUILD_FLAGS`] describes and reads its JSON lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use proc_macro2::{Literal, TokenStream};
use quote::{ToTokens, format_ident, quote};

use super::{Output, Templates};
use crate::Error;
use crate::plan::{Consts, Plan};
use crate::registry::{Implementation, Registry, sha256_hex};
use crate::rust_source;
use crate::workload::Architecture;

/// One interface as the harness measures it.
#[derive(Debug, Clone)]
pub struct HarnessInterface {
    pub interface: String,
    /// The competitors, in declared-priority order.
    pub candidates: Vec<Implementation>,
    /// The interface's reference implementation.
    pub reference: Implementation,
    /// Its decode pass times a batched step of `DECODE_ROWS` sequences in one call (a LLaMA
    /// workload's products, norms and activations), and its records count a sequence's share.
    pub batched_rows: bool,
}

/// The interfaces of `plan` with their competitors and references.
pub fn interfaces(plan: &Plan, registry: &Registry) -> Vec<HarnessInterface> {
    plan.interfaces
        .iter()
        .map(|i| {
            let imps = registry.implementations_of(&i.interface);
            let candidates = i
                .competitors
                .iter()
                .filter_map(|name| {
                    imps.iter().find(|imp| &imp.name == name && imp.element == i.element).cloned()
                })
                .collect();
            let reference = registry
                .implementation(&i.interface, &i.reference, i.element.as_deref())
                .expect("the registry checks that every interface's reference exists")
                .clone();
            let batched_rows = matches!(plan.consts, Consts::Llama(_))
                && crate::rankings::ROW_BATCHED.contains(&i.interface.as_str());
            HarnessInterface { interface: i.interface.clone(), candidates, reference, batched_rows }
        })
        .collect()
}

/// The benchmark template of `plan`'s architecture: the traits and passes that time each
/// interface.
fn passes_template(plan: &Plan) -> &'static str {
    match plan.consts.architecture() {
        Architecture::Llama => "bench/llama.rs",
        Architecture::Bert => "bench/bert.rs",
    }
}

/// The interfaces of `plan` that its harness times: those whose pass (`passes::<Interface>Pass`)
/// the benchmark template defines. An interface without one is left out where only one
/// implementation competes: there is nothing to rank (a new slot, with
/// its reference alone, needs no pass until a second implementation comes). Where several
/// compete, the harness could not rank them, and says so.
pub fn timed(plan: &Plan, templates: &Templates) -> Result<Vec<String>, Error> {
    let name = passes_template(plan);
    let file = rust_source::parse_with_comments(templates.get(name)?).map_err(|e| Error::Template {
        name: name.into(),
        message: format!("line {}: {}", e.line, e.message),
    })?;
    let passes: BTreeSet<String> = file
        .items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Struct(s) => Some(s.ident.to_string()),
            _ => None,
        })
        .collect();
    let mut timed = Vec::new();
    for i in &plan.interfaces {
        let pass = format!("{}Pass", super::common::camel_ident(&i.interface));
        if passes.contains(&pass) {
            timed.push(i.interface.clone());
        } else if i.competitors.len() > 1 {
            return Err(Error::Refused(format!(
                "{} implementations of `{}` compete for {}, but templates/{name} has no `{pass}` to time \
                 them: add its trait and pass (ARCHITECTURE.md, \"A second implementation of a new slot\")",
                i.competitors.len(),
                i.interface,
                plan.name
            )));
        }
    }
    Ok(timed)
}

/// The crate name of a harness: the workload's name and a hash of the harness's sources, so
/// that harnesses of different sources sharing one target folder never overwrite each other's
/// executable.
pub fn crate_name(plan: &Plan, files: &BTreeMap<PathBuf, String>) -> String {
    let mut all = String::new();
    for (path, text) in files {
        all.push_str(&format!("{}\n{}\n", path.display(), text));
    }
    format!("monogen-bench-{}-{}", plan.name, &sha256_hex(all.as_bytes())[..12])
}

fn module_ident(imp: &Implementation) -> proc_macro2::Ident {
    format_ident!("{}__{}", imp.interface, imp.name.replace('-', "_"))
}

fn type_ident(imp: &Implementation) -> proc_macro2::Ident {
    let (interface, name) =
        (super::common::camel_ident(&imp.interface), super::common::camel_ident(&imp.name));
    format_ident!("{interface}{name}")
}

/// Emits the harness crate for `plan`; returns it and its crate name.
pub fn emit(plan: &Plan, registry: &Registry, templates: &Templates) -> Result<(Output, String), Error> {
    let timed = timed(plan, templates)?;
    let mut harness = interfaces(plan, registry);
    harness.retain(|h| timed.contains(&h.interface));
    let mut files = BTreeMap::new();
    let mut included: BTreeMap<(String, String), Implementation> = BTreeMap::new();
    for h in &harness {
        for imp in h.candidates.iter().chain([&h.reference]) {
            included.insert((imp.interface.clone(), imp.name.clone()), imp.clone());
        }
    }
    let shared: BTreeSet<String> = included.values().flat_map(|i| i.shared.iter().cloned()).collect();

    for imp in included.values() {
        let file = rust_source::parse_with_comments(&imp.source).map_err(|e| Error::Template {
            name: imp.dir.join("kernel.rs").display().to_string(),
            message: e.message,
        })?;
        files.insert(
            PathBuf::from(format!("src/kernels/{}.rs", module_ident(imp))),
            rust_source::print(&file),
        );
    }
    for name in &shared {
        let module = &registry.shared[name];
        let file = rust_source::parse_with_comments(&module.source)
            .map_err(|e| Error::Template { name: module.path.display().to_string(), message: e.message })?;
        files.insert(PathBuf::from(format!("src/kernels/shared/{name}.rs")), rust_source::print(&file));
    }
    let modules = included.values().map(module_ident);
    let shared_idents = shared.iter().map(|m| format_ident!("{m}"));
    let jobs: Vec<super::common::TeamJob> = included
        .values()
        .filter_map(|imp| {
            let path = imp.team_job_path(&module_ident(imp).to_string())?;
            Some(super::common::TeamJob::new(type_ident(imp), &path))
        })
        .collect();
    let team_job = super::common::team_job_enum(&jobs);
    files.insert(
        PathBuf::from("src/kernels/mod.rs"),
        rust_source::print_tokens(quote! {
            //! Every competing implementation, and each interface's reference.
            #![allow(dead_code, non_snake_case)]
            #(pub mod #modules;)*
            pub mod shared {
                #(pub mod #shared_idents;)*
            }
            #team_job
        }),
    );
    let harness_source = templates.get("bench/harness.rs")?;
    let harness_file = rust_source::parse_with_comments(harness_source).map_err(|e| Error::Template {
        name: "bench/harness.rs".into(),
        message: format!("line {}: {}", e.line, e.message),
    })?;
    files.insert(PathBuf::from("src/harness.rs"), rust_source::print(&harness_file));
    let passes_name = passes_template(plan);
    let passes = rust_source::parse_with_comments(templates.get(passes_name)?).map_err(|e| {
        Error::Template { name: passes_name.into(), message: format!("line {}: {}", e.line, e.message) }
    })?;
    files.insert(PathBuf::from("src/passes.rs"), rust_source::print(&passes));
    files.insert(
        PathBuf::from("src/main.rs"),
        rust_source::print_tokens(main_rs(plan, registry, &harness, &included)),
    );
    // The crates the competing kernels use.
    let mut crates: Vec<&str> =
        included.values().flat_map(|i| i.dependencies.iter().map(String::as_str)).collect();
    crates.sort_unstable();
    crates.dedup();
    let dependencies = super::dependencies(&crates, &[], templates)?;
    let context = serde_json::json!({
        "name": crate_name(plan, &files),
        "workload": plan.name,
        "dependencies": dependencies,
    });
    let name = crate_name(plan, &files);
    files.insert(PathBuf::from("Cargo.toml"), templates.render("bench/Cargo.toml.j2", &context)?);
    Ok((Output { files }, name))
}

fn usize_lit(v: usize) -> Literal {
    Literal::usize_unsuffixed(v)
}

fn main_rs(
    plan: &Plan,
    registry: &Registry,
    harness: &[HarnessInterface],
    included: &BTreeMap<(String, String), Implementation>,
) -> TokenStream {
    let doc = [
        format!(" Benchmark harness for workload `{}`, generated by `monogen bench`: every", plan.name),
        " competing implementation of each interface, checked against the reference and timed at".into(),
        " the workload's shapes. Prints JSON lines for monogen to read.".into(),
    ];
    let consts = match &plan.consts {
        Consts::Llama(c) => llama_consts(c),
        Consts::Bert(c) => bert_consts(c),
    };
    let impls = included.values().map(|imp| trait_impl(imp, registry));
    let calls = harness.iter().map(|h| format_ident!("{}", h.interface));
    let n_interfaces = usize_lit(harness.len());
    let benches = harness.iter().map(|h| bench_fn(h, registry));
    let amx = included
        .values()
        .any(|imp| super::common::needs_amx_fn(&imp.constraints.cpu_features))
        .then(super::common::amx_fn);

    quote! {
        #(#![doc = #doc])*

        mod harness;
        mod kernels;
        mod passes;

        #consts

        #(#impls)*

        fn main() {
            let options = harness::Options::from_args();
            harness::begin(#n_interfaces, &options);
            #(#calls(&options);)*
        }

        #(#benches)*

        #amx
    }
}

/// The constants of a LLaMA workload's passes.
fn llama_consts(c: &crate::plan::LlamaConsts) -> TokenStream {
    let r = &c.request;
    let prompt = c.prefill_chunk.min(r.typical_prompt_len).max(1);
    let context = (prompt + r.typical_decode_len / 2).min(c.max_seq_len - 1);
    let [dim, hidden, layers, heads, kv_heads, head_dim, vocab, max_seq] = [
        c.hidden_size,
        c.intermediate_size,
        c.num_layers,
        c.num_heads,
        c.num_kv_heads,
        c.head_dim,
        c.vocab_size,
        c.max_seq_len,
    ]
    .map(usize_lit);
    let (prompt_lit, decode_lit, context_lit) =
        (usize_lit(prompt), usize_lit(r.typical_decode_len), usize_lit(context));
    let decode_rows = usize_lit(r.max_batch);
    let threads = usize_lit(c.threads);
    let rope_theta = super::common::f32_lit(c.rope_theta);
    let eps = super::common::f32_lit(c.rms_norm_eps);
    quote! {
        pub const DIM: usize = #dim;
        pub const HIDDEN_DIM: usize = #hidden;
        pub const N_LAYERS: usize = #layers;
        pub const N_HEADS: usize = #heads;
        pub const N_KV_HEADS: usize = #kv_heads;
        pub const HEAD_DIM: usize = #head_dim;
        pub const Q_DIM: usize = N_HEADS * HEAD_DIM;
        pub const KV_DIM: usize = N_KV_HEADS * HEAD_DIM;
        pub const VOCAB_SIZE: usize = #vocab;
        pub const MAX_SEQ_LEN: usize = #max_seq;
        pub const ROPE_THETA: f32 = #rope_theta;
        pub const RMS_NORM_EPS: f32 = #eps;
        /// Worker threads the kernels may use, as in the generated crate.
        pub const THREADS: usize = #threads;
        /// Rows of a prefill pass: the typical prompt.
        pub const PROMPT: usize = #prompt_lit;
        /// Decode steps of a typical request.
        pub const DECODE_STEPS: usize = #decode_lit;
        /// The position of a typical decode step: the prompt and half the decode steps.
        pub const CONTEXT: usize = #context_lit;
        /// Sequences of one decode step (`request.max_batch`): the rows that the products, norms
        /// and activations of a batched step take in one call.
        pub const DECODE_ROWS: usize = #decode_rows;
        /// The most rows a pass takes.
        pub const ROWS: usize = if PROMPT > DECODE_ROWS { PROMPT } else { DECODE_ROWS };
    }
}

/// The constants of a BERT workload's passes.
fn bert_consts(c: &crate::plan::BertConsts) -> TokenStream {
    let r = &c.request;
    let [dim, hidden, layers, heads, head_dim, vocab, types, positions, seq, batch, threads] = [
        c.hidden_size,
        c.intermediate_size,
        c.num_layers,
        c.num_heads,
        c.head_dim,
        c.vocab_size,
        c.type_vocab_size,
        c.max_position_embeddings,
        r.typical_seq_len,
        r.typical_batch,
        c.threads,
    ]
    .map(usize_lit);
    let eps = super::common::f32_lit(c.layer_norm_eps);
    quote! {
        pub const DIM: usize = #dim;
        pub const HIDDEN_DIM: usize = #hidden;
        pub const N_LAYERS: usize = #layers;
        pub const N_HEADS: usize = #heads;
        pub const HEAD_DIM: usize = #head_dim;
        pub const VOCAB_SIZE: usize = #vocab;
        pub const TYPE_VOCAB_SIZE: usize = #types;
        pub const MAX_POSITIONS: usize = #positions;
        pub const LAYER_NORM_EPS: f32 = #eps;
        /// Worker threads the kernels may use, as in the generated crate.
        pub const THREADS: usize = #threads;
        /// Tokens of a typical sentence.
        pub const SEQ: usize = #seq;
        /// Sentences of a typical call.
        pub const BATCH: usize = #batch;
        /// Rows of a typical call.
        pub const ROWS: usize = BATCH * SEQ;
        /// An encoder has no decode step.
        pub const DECODE_STEPS: usize = 0;
    }
}

/// The unit struct of one implementation and its trait impl, forwarding to the kernel.
fn trait_impl(imp: &Implementation, registry: &Registry) -> TokenStream {
    let ty = type_ident(imp);
    let m = module_ident(imp);
    let doc = format!(" {}/{} {}", imp.interface, imp.name, imp.version);
    let body = match imp.interface.as_str() {
        "matmul" => matmul_impl(imp, &ty, &m),
        "kv_cache" => kv_cache_impl(imp, registry, &ty, &m),
        _ => forwarding_impl(imp, registry, &ty, &m),
    };
    quote! {
        #[doc = #doc]
        struct #ty;
        #body
    }
}

/// The trait of `templates/bench/llama.rs` or `bert.rs` that an interface's implementations
/// implement (`passes::AttentionDecode` for `attention_decode`), with a method per function of
/// the interface, as its element type declares it, that calls the kernel's. An interface over
/// a KV cache's element type names it as the trait's `Kv`.
fn forwarding_impl(
    imp: &Implementation,
    registry: &Registry,
    ty: &proc_macro2::Ident,
    m: &proc_macro2::Ident,
) -> TokenStream {
    // The harness runs on the CPU: the functions of the implementation's own device.
    let interface = &registry.interfaces[&imp.interface].for_device(imp.device());
    let at = interface.at(interface.element_of(imp));
    let trait_name = super::common::camel_ident(&imp.interface);
    let kv = imp.elements.contains_key("kv").then(|| {
        let kv = kv_element(imp, registry);
        quote!(type Kv = #kv;)
    });
    let methods = at.functions.iter().map(|f| {
        let decl = crate::registry::parse_fn_decl(&f.signature).expect("checked when the interface loaded");
        let sig = &decl.sig;
        let name = &sig.ident;
        let consts = sig.generics.const_params().map(|c| &c.ident);
        let args = sig.inputs.iter().filter_map(|input| match input {
            syn::FnArg::Typed(t) => Some(&t.pat),
            syn::FnArg::Receiver(_) => None,
        });
        quote! {
            #[inline]
            #sig {
                kernels::#m::#name::<#(#consts),*>(#(#args),*)
            }
        }
    });
    quote! {
        impl passes::#trait_name for #ty {
            #kv
            #(#methods)*
        }
    }
}

/// `harness::Matmul` for a product of the weights as its crate holds them: f32, bfloat16
/// (with f32 or bfloat16 activations), blockwise int8, each as read or packed, or blockwise
/// int4.
fn matmul_impl(imp: &Implementation, ty: &proc_macro2::Ident, m: &proc_macro2::Ident) -> TokenStream {
    match imp.elements.get("weights").map(String::as_str) {
        Some(dtype @ ("f32" | "bf16")) => {
            // bfloat16 weights are rounded to the nearest bfloat16 first, as the crate converts
            // an F32 file; f32 ones are placed as they are.
            let (elem, convert, src, rounded) = if dtype == "f32" {
                (quote!(f32), quote!(), quote!(w), None)
            } else {
                let convert =
                    quote! { let bits: Vec<u16> = w.iter().map(|&v| harness::bf16_bits(v)).collect(); };
                let rounded = " Rounded to the nearest bfloat16, as the crate converts an F32 file";
                (quote!(u16), convert, quote!(&bits), Some(rounded))
            };
            let weights = if imp.packs_weights {
                let doc = match rounded {
                    Some(r) => {
                        format!("{r}, then packed by the kernel, as the crate packs them at load (timed).")
                    }
                    None => " Packed by the kernel, as the crate packs them at load (timed).".to_string(),
                };
                quote! {
                    #[doc = #doc]
                    fn weights(storage: &mut harness::Storage, w: &[f32], n: usize, k: usize) -> harness::Placed<#elem> {
                        #convert
                        storage.place_packed(|| kernels::#m::pack(#src, n, k))
                    }
                }
            } else {
                let doc = rounded.map(|r| {
                    let r = format!("{r}.");
                    quote!(#[doc = #r])
                });
                quote! {
                    #doc
                    fn weights(storage: &mut harness::Storage, w: &[f32], _n: usize, _k: usize) -> harness::Placed<#elem> {
                        #convert
                        storage.place(#src)
                    }
                }
            };
            quote! {
                impl harness::Matmul for #ty {
                    type Weights = harness::Placed<#elem>;
                    #weights
                    #[inline]
                    fn matmul<const N: usize, const K: usize>(out: &mut [f32], x: &[f32], w: &harness::Placed<#elem>, rows: usize) {
                        kernels::#m::matmul::<N, K>(out, x, w, rows)
                    }
                }
            }
        }
        Some("int8") => {
            let place = if imp.packs_weights {
                quote! {
                    // Packed by the kernel, scales included, as the crate packs them at load
                    // (timed), and no scales apart.
                    (storage.place_packed(|| kernels::#m::pack((&values, &scales), n, k)), storage.place(&[]))
                }
            } else {
                quote! { (storage.place(&values), storage.place(&scales)) }
            };
            quote! {
            impl harness::Matmul for #ty {
                /// The values and the scale of each block of 32 of a row (for a kernel that
                /// packs them, its packed bytes and no scales).
                type Weights = (harness::Placed<i8>, harness::Placed<f32>);
                /// Quantized per block of 32 of each row, as the crate quantizes at load.
                fn weights(
                    storage: &mut harness::Storage,
                    w: &[f32],
                    n: usize,
                    k: usize,
                ) -> (harness::Placed<i8>, harness::Placed<f32>) {
                    let (mut values, mut scales) = (Vec::with_capacity(n * k), Vec::new());
                    for row in w.chunks(k) {
                        for block in row.chunks(32) {
                            let amax = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                            let scale = harness::q8_scale(amax);
                            let inverse = if amax > 0.0 { 1.0 / scale } else { 0.0 };
                            scales.push(scale);
                            values.extend(block.iter().map(|v| (v * inverse).round_ties_even() as i8));
                        }
                    }
                    #place
                }
                #[inline]
                fn matmul<const N: usize, const K: usize>(
                    out: &mut [f32],
                    x: &[f32],
                    w: &(harness::Placed<i8>, harness::Placed<f32>),
                    rows: usize,
                ) {
                    kernels::#m::matmul::<N, K>(out, x, (&w.0, &w.1), rows)
                }
            }
            }
        }
        Some("int4") => quote! {
            impl harness::Matmul for #ty {
                /// The bytes of the four-bit values and the binary16 scale and minimum of each
                /// block of 32 of a row.
                type Weights = (harness::Placed<u8>, harness::Placed<u16>);
                /// Quantized per block of 32 of each row, as the crate quantizes at load.
                fn weights(
                    storage: &mut harness::Storage,
                    w: &[f32],
                    n: usize,
                    k: usize,
                ) -> (harness::Placed<u8>, harness::Placed<u16>) {
                    let (values, scales) = harness::q4_quantize(w, n, k);
                    (storage.place(&values), storage.place(&scales))
                }
                #[inline]
                fn matmul<const N: usize, const K: usize>(
                    out: &mut [f32],
                    x: &[f32],
                    w: &(harness::Placed<u8>, harness::Placed<u16>),
                    rows: usize,
                ) {
                    kernels::#m::matmul::<N, K>(out, x, (&w.0, &w.1), rows)
                }
            }
        },
        other => unreachable!("the harness has no matmul of weights {other:?}"),
    }
}

/// `passes::KvCache` for a cache of the element type the implementation takes.
fn kv_cache_impl(
    imp: &Implementation,
    registry: &Registry,
    ty: &proc_macro2::Ident,
    m: &proc_macro2::Ident,
) -> TokenStream {
    let kv = kv_element(imp, registry);
    quote! {
        impl passes::KvCache for #ty {
            type Kv = #kv;
            type Cache = kernels::#m::KvCache<MAX_SEQ_LEN, KV_DIM>;
            fn new() -> Self::Cache {
                kernels::#m::KvCache::new()
            }
            #[inline]
            fn store(cache: &mut Self::Cache, start: usize, k: &[f32], v: &[f32]) {
                cache.store(start, k, v)
            }
            #[inline]
            fn keys(cache: &Self::Cache, len: usize) -> &[#kv] {
                cache.keys(len)
            }
            #[inline]
            fn values(cache: &Self::Cache, len: usize) -> &[#kv] {
                cache.values(len)
            }
        }
    }
}

/// The Rust type of the KV cache's elements that an implementation stores or reads, as its
/// interface's element type names it (`KV`: `f32`, or `u16` for bfloat16 bits).
fn kv_element(imp: &Implementation, registry: &Registry) -> TokenStream {
    let element = registry.interfaces[&imp.interface].element_of(imp);
    let kv =
        element.and_then(|e| e.types.get("KV")).expect("the cache and the attentions name their KV type");
    syn::parse_str::<syn::Type>(kv).expect("an element type's KV is a Rust type").into_token_stream()
}

/// An expression that is `Ok(())` when this machine has `imp`'s CPU features.
fn availability(imp: &Implementation) -> TokenStream {
    if imp.constraints.cpu_features.is_empty() {
        return quote!(Ok(()));
    }
    let checks = imp.constraints.cpu_features.iter().map(|f| super::common::feature_detected(f));
    let missing = format!("this machine lacks one of {}", imp.constraints.cpu_features.join(", "));
    quote! {
        if #(#checks)&&* { Ok(()) } else { Err(#missing.to_string()) }
    }
}

/// `fn <interface>(options)`: validate every candidate, then time them round by round.
fn bench_fn(h: &HarnessInterface, registry: &Registry) -> TokenStream {
    let name = format_ident!("{}", h.interface);
    let interface = &h.interface;
    let names: Vec<&str> = h.candidates.iter().map(|c| c.name.as_str()).collect();
    let reference = type_ident(&h.reference);
    let doc = format!(" {}: {} (reference: {})", h.interface, names.join(", "), h.reference.name);
    let (pass_new, pass_ty) = match interface.as_str() {
        "matmul" => (
            quote!(passes::MatmulPass::new::<#reference>()),
            quote!(passes::MatmulPass::<<#reference as harness::Matmul>::Weights>),
        ),
        "rope" => (quote!(passes::RopePass::new::<#reference>()), quote!(passes::RopePass)),
        "kv_cache" => (quote!(()), quote!(())),
        // Every other interface's pass is named after it (`passes::MeanPoolingPass`), generic
        // over the KV cache's element type where the interface reads the cache.
        _ => {
            let pass = format_ident!("{}Pass", super::common::camel_ident(interface));
            let ty = match h.reference.elements.contains_key("kv") {
                true => {
                    let kv = kv_element(&h.reference, registry);
                    quote!(passes::#pass::<#kv>)
                }
                false => quote!(passes::#pass),
            };
            (quote!(#ty::new()), ty)
        }
    };
    let validations = h.candidates.iter().enumerate().map(|(i, c)| {
        let ty = type_ident(c);
        let i = usize_lit(i);
        let available = availability(c);
        let check = if interface == "kv_cache" {
            quote!(passes::check_kv_cache::<#ty, #reference>())
        } else if c.packs_weights {
            let own = format_ident!("packed_{}", i.to_string());
            quote!(pass.check_packed::<#ty, #reference>(#own.as_mut().expect("packed where this machine runs it")))
        } else {
            quote!(pass.check::<#ty, #reference>())
        };
        quote! { bench.validate(#i, #available, || #check); }
    });
    let samples = h.candidates.iter().enumerate().map(|(i, c)| {
        let ty = type_ident(c);
        let pass_var = format_ident!("cache_{}", i);
        let i = usize_lit(i);
        if interface == "kv_cache" {
            quote! {
                if bench.live(#i) {
                    bench.sample(#i, passes::KvCachePass::<#ty>::PHASES, |decode| #pass_var.run(decode));
                }
            }
        } else if c.packs_weights {
            let own = format_ident!("packed_{}", i.to_string());
            quote! {
                if bench.live(#i) {
                    let own = #own.as_mut().expect("packed where this machine runs it");
                    bench.sample(#i, #pass_ty::PHASES, |decode| own.run::<#ty>(decode));
                }
            }
        } else {
            quote! {
                if bench.live(#i) {
                    bench.sample(#i, #pass_ty::PHASES, |decode| pass.run::<#ty>(decode));
                }
            }
        }
    });
    let setup = if interface == "kv_cache" {
        let caches = h.candidates.iter().enumerate().map(|(i, c)| {
            let ty = type_ident(c);
            let var = format_ident!("cache_{}", i);
            quote! { let mut #var = passes::KvCachePass::<#ty>::new(); }
        });
        quote! { #(#caches)* }
    } else {
        // A candidate that packs its weights runs on a pass of its own: the same matrices
        // (the same seed), as it holds them. Only where this machine runs it: its packing may
        // use instructions that the machine lacks (an AVX-512 layout on an AVX2 CPU).
        let own_passes = h.candidates.iter().enumerate().filter(|(_, c)| c.packs_weights).map(|(i, c)| {
            let ty = type_ident(c);
            let own = format_ident!("packed_{}", i.to_string());
            let i = usize_lit(i);
            let available = availability(c);
            quote! {
                let mut #own = match #available {
                    Ok(()) => Some(passes::MatmulPass::new::<#ty>()),
                    Err(_) => None,
                };
                if let Some(own) = &#own {
                    bench.packed(#i, own.packing());
                }
            }
        });
        quote! {
            let mut pass = #pass_new;
            #(#own_passes)*
        }
    };
    // A batched step passes the rows of all its sequences through one call of these; the other
    // interfaces run once per sequence, a step of one row each.
    let decode_rows = h.batched_rows.then(|| quote! { bench.decode_rows(crate::DECODE_ROWS); });
    quote! {
        #[doc = #doc]
        fn #name(options: &harness::Options) {
            let mut bench = harness::Bench::new(#interface, &[#(#names),*], options);
            #decode_rows
            #setup
            #(#validations)*
            for _ in 0..bench.rounds() {
                #(#samples)*
                bench.end_round();
            }
            bench.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// A candidate that packs its weights packs them only behind the check of the machine's
    /// CPU features: its packing may use instructions that the machine lacks (on a Zen 3, the
    /// AVX-512 bf16 layouts' packing stopped the harness with SIGILL before any candidate was
    /// skipped).
    #[test]
    fn a_packing_candidate_packs_only_where_the_machine_runs_it() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let project = crate::Project::load(root).unwrap();
        let path = root.join("workloads/stories260k-cpu-bf16.toml");
        let mut workload = project.read_workload(&path).unwrap();
        let avx512 = ["avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl", "avx512bf16"];
        workload.target.cpu_features.extend(avx512.map(String::from));
        let plan = project.plan(&workload, &path).unwrap();
        let (output, _) = super::emit(&plan, &project.registry, &project.templates).unwrap();
        let main = &output.files[Path::new("src/main.rs")];
        let packing = ["avx512-packed-threads", "avx2-packed-threads"];
        for name in packing {
            assert!(main.contains(name), "{name} competes in the harness");
        }
        let passes: Vec<&str> =
            main.lines().filter(|l| l.trim_start().starts_with("let mut packed_")).collect();
        assert!(passes.len() >= packing.len(), "{passes:?}");
        for line in passes {
            assert!(line.contains("= match if "), "built before the check of the CPU: {line}");
        }
        assert!(main.contains("Some(passes::MatmulPass::new::<"), "{main}");
    }

    /// The harness times the interfaces whose pass the benchmark template defines. A slot
    /// without one is left out while its reference is its only implementation (nothing to
    /// rank), and refused once several compete.
    #[test]
    fn an_interface_is_timed_where_the_template_has_its_pass() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let project = crate::Project::load(root).unwrap();
        let path = root.join("workloads/stories260k-cpu-f32.toml");
        let plan = project.plan(&project.read_workload(&path).unwrap(), &path).unwrap();
        let all: Vec<String> = plan.interfaces.iter().map(|i| i.interface.clone()).collect();
        assert_eq!(super::timed(&plan, &project.templates).unwrap(), all);
        let passes = project.templates.get("bench/llama.rs").unwrap();
        let without = |pass: &str| {
            assert!(passes.contains(&format!("pub struct {pass} ")), "bench/llama.rs defines {pass}");
            let text = passes.replace(&format!("pub struct {pass} "), &format!("pub struct {pass}Gone "));
            project.templates.clone().with_file("bench/llama.rs", text)
        };
        // The sampler has one implementation: without its pass, the harness leaves it out.
        assert_eq!(plan.interface("sampler").unwrap().competitors.len(), 1);
        let templates = without("SamplerPass");
        let timed = super::timed(&plan, &templates).unwrap();
        assert_eq!(timed, all.iter().filter(|i| *i != "sampler").cloned().collect::<Vec<_>>());
        let (output, _) = super::emit(&plan, &project.registry, &templates).unwrap();
        let main = &output.files[Path::new("src/main.rs")];
        assert!(!main.contains("SamplerPass") && main.contains("RmsnormPass"), "{main}");
        // Several rmsnorm kernels compete: without its pass, they could not be ranked.
        assert!(plan.interface("rmsnorm").unwrap().competitors.len() > 1);
        let refused = super::timed(&plan, &without("RmsnormPass")).unwrap_err().to_string();
        assert!(
            refused.contains("implementations of `rmsnorm` compete") && refused.contains("no `RmsnormPass`"),
            "{refused}"
        );
    }
}
