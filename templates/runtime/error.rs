//! Errors of loading a model and running it. Each one names what is wrong (the file, the
//! tensor, the value) and maps to an exit code of the binary.

use std::path::PathBuf;

/// Everything that can go wrong that is not a bug.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The CPU lacks features that the chosen kernels were compiled for.
    #[error(
        "this CPU lacks {missing}, which crate {workload} was generated for (target.cpu_features of its workload); generate a crate for this machine with `monogen init` and `monogen build`"
    )]
    UnsupportedCpu { missing: String, workload: &'static str },
    /// A file or directory of the model cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The weights file is not a well-formed safetensors file.
    #[error("{} is not a valid safetensors file: {reason}", path.display())]
    InvalidWeights { path: PathBuf, reason: String },
    /// The files of a checkpoint do not fit together: a sharded checkpoint's index and its
    /// shards, or names that give one tensor twice.
    #[error("{}: {reason}", path.display())]
    InvalidCheckpoint { path: PathBuf, reason: String },
    /// A tensor the model needs is not in the weights file.
    #[error("tensor `{name}` is missing from {}", path.display())]
    MissingTensor { path: PathBuf, name: String },
    /// The weights are a model of another architecture than the one this crate runs.
    #[error(
        "{} holds {found}, but this crate runs {expected}: point it at a model of its workload, or generate a crate for this one with `monogen init --hf DIR`",
        path.display()
    )]
    WrongArchitecture { path: PathBuf, expected: &'static str, found: &'static str },
    /// A tensor has another shape than the one this crate was generated for.
    #[error("tensor `{name}` has shape {found:?}, but this crate was generated for {expected:?}")]
    WrongShape { name: String, expected: Vec<usize>, found: Vec<usize> },
    /// A tensor has another dtype than the one this crate reads.
    #[error("tensor `{name}` has dtype {found}, but this crate reads {expected}")]
    WrongDtype { name: String, expected: &'static str, found: String },
    /// A saved model holds a matrix packed for another kernel than the one this crate reads it
    /// with (`--save-model` of a crate whose matmul packs its weights).
    #[error(
        "tensor `{name}` is packed for {found}, but this crate's matmul reads {expected}; load the checkpoint it was saved from, or save it again with this crate (--save-model)"
    )]
    WrongLayout { name: String, expected: &'static str, found: String },
    /// tokenizer.json cannot be loaded or used.
    #[error("tokenizer {}: {reason}", path.display())]
    Tokenizer { path: PathBuf, reason: String },
    /// The tokenizer can produce ids that the model has no embedding for.
    #[error(
        "tokenizer {} can produce token id {largest}, but the model's vocabulary has {expected} rows",
        path.display()
    )]
    VocabularyMismatch { path: PathBuf, largest: u32, expected: usize },
    /// A token id is not below the vocabulary size.
    #[error("token id {id} is outside the vocabulary (ids are below {vocab_size})")]
    TokenOutOfRange { id: u32, vocab_size: usize },
    /// The sequence does not fit the positions this crate was generated for.
    #[error(
        "the sequence would hold {len} tokens, more than the {max} positions this crate was generated for (request.max_seq_len of its workload)"
    )]
    SequenceTooLong { len: usize, max: usize },
    /// There is nothing to run.
    #[error("the prompt is empty: give at least one token")]
    EmptyPrompt,
    /// A sampling parameter is out of range.
    #[error("invalid {name}: {reason}")]
    InvalidParameter { name: &'static str, reason: String },
    /// No GPU to run on: no NVIDIA driver, no device, or no NVRTC to compile the kernels with.
    #[only_if(cuda)]
    #[error("no GPU to run crate {} on: {reason}", crate::WORKLOAD)]
    NoGpu { reason: String },
    /// The GPU is of another architecture than the one the crate was generated for.
    #[only_if(cuda)]
    #[error(
        "this GPU is {found}, but crate {workload} was generated for {expected} (target.cuda_arch of its workload); generate a crate for it with `monogen init --device cuda --cuda-arch {found}` and `monogen build`"
    )]
    WrongGpu { found: String, expected: &'static str, workload: &'static str },
    /// A call to the GPU failed: memory ran out, a kernel did not compile or launch.
    #[only_if(cuda)]
    #[error("GPU: {reason}")]
    Gpu { reason: String },
}

#[only_if(cuda)]
impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Error {
        Error::Gpu { reason: e.to_string() }
    }
}

impl Error {
    /// The binary's exit code: 2 for bad arguments, 3 for bad model files, 4 for an unsupported CPU.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::UnsupportedCpu { .. } => 4,
            #[only_if(cuda)]
            Error::NoGpu { .. } | Error::WrongGpu { .. } => 5,
            #[only_if(cuda)]
            Error::Gpu { .. } => 6,
            Error::Io { .. }
            | Error::InvalidWeights { .. }
            | Error::InvalidCheckpoint { .. }
            | Error::MissingTensor { .. }
            | Error::WrongArchitecture { .. }
            | Error::WrongShape { .. }
            | Error::WrongDtype { .. }
            | Error::WrongLayout { .. }
            | Error::Tokenizer { .. }
            | Error::VocabularyMismatch { .. } => 3,
            Error::TokenOutOfRange { .. }
            | Error::SequenceTooLong { .. }
            | Error::EmptyPrompt
            | Error::InvalidParameter { .. } => 2,
        }
    }
}
