//! What a fast backend's scoring call did: its work and where its time went. Its own module, so
//! that the engines (cpu/, cuda/) report it without importing `backend`, which builds them.

/// Time and work of a fast backend's last `variant_losses` call (CPU or CUDA), for benchmarks
/// and logs.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunStats {
    /// Tokens computed: the plans' unique prefixes, summed over chunks.
    pub unique_tokens: usize,
    /// Rows that went through the LM head.
    pub head_rows: usize,
    /// Plan chunks the batch was cut into (the memory budget).
    pub chunks: usize,
    /// Seconds in the layer GEMMs (q/k/v, out_proj, fc_in, fc_out).
    pub trunk_gemm_secs: f64,
    /// Seconds in tree attention.
    pub attention_secs: f64,
    /// Seconds in the LM head (ln_f, logits, log-softmax, targets).
    pub head_secs: f64,
    /// Seconds of the whole call, planning included.
    pub total_secs: f64,
}
