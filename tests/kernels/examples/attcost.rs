use monogen_kernel_tests::kernels;
use monogen_kernel_tests::rng::Rng;
use std::time::Instant;
fn run<const H: usize, const D: usize>(label: &str) {
    let rows = 128;
    let mut rng = Rng::new(3);
    let q = rng.vec(rows * H * D, 2.0);
    let k = rng.vec(rows * H * D, 1.0);
    let v = rng.vec(rows * H * D, 1.0);
    let mut out = vec![0f32; rows * H * D];
    let mut scores = vec![0f32; 1024];
    let flops = 4.0 * (H * D) as f64 * (rows * (rows + 1) / 2) as f64;
    for _ in 0..3 {
        let mut t = vec![];
        for _ in 0..200 {
            let s = Instant::now();
            kernels::attention_prefill__avx2_fma_threads::attention_prefill::<H, H, D>(
                &mut out,
                &q,
                &k,
                &v,
                &mut scores,
                0,
                rows,
            );
            t.push(s.elapsed().as_secs_f64());
        }
        t.sort_by(f64::total_cmp);
        println!(
            "{label}: median {:.1} us, {:.1} GFLOP/s; first-call-free min {:.1} us",
            t[100] * 1e6,
            flops / t[100] / 1e9,
            t[0] * 1e6
        );
    }
}
fn main() {
    run::<6, 48>("stories15M 6x48");
    run::<12, 64>("stories110M 12x64");
}
