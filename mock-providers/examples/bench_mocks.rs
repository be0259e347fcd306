//! Prints the fakes' capacity on loopback: `cargo run --release -p mock-providers --example
//! bench_mocks [seconds]`. The CLI's `ting-chaos bench mocks` calls the same function.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let secs: f64 = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(3.0);
    let report = mock_providers::bench::capacity(std::time::Duration::from_secs_f64(secs)).await?;
    print!("{report}");
    Ok(())
}
