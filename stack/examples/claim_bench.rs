//! Prints the claim benchmark (what `ting-chaos bench claim` reports):
//! `cargo run -p stack --release --example claim_bench [-- postgres://…/db]`. Without a URL it
//! uses a throwaway database (`DATABASE_URL` or a private cluster). The database is truncated.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let arg = std::env::args().nth(1);
    let db = match arg {
        Some(_) => None,
        None => Some(throwaway_pg::test_database().await?),
    };
    let url = arg.unwrap_or_else(|| db.as_ref().map(|d| d.url.clone()).unwrap_or_default());
    stack::migrate(&url).await?;
    let opts = stack::bench::BenchOptions::default();
    let rows = stack::bench::claim_bench(&url, &opts, |_| {}).await?;
    print!("{}", stack::bench::render(&rows));
    Ok(())
}
