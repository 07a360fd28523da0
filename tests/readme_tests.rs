//! The README's embedding example is the doc test of src/lib.rs (which runs on
//! the default model): every line of one is a line of the other.

#[test]
fn readme_example_is_the_doc_test() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let lib = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/lib.rs")).unwrap();
    // The section's own heading (not "### Embeddings", the endpoint's).
    let start = readme
        .find("\n## Embedding\n")
        .expect("README has an Embedding section");
    let block = &readme[start..];
    let code = block
        .split("```rust\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a rust block");
    let doc: Vec<String> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("//!"))
        .map(|l| l.trim().to_string())
        .collect();
    let wrapper = ["fn main() -> Result<(), Box<dyn std::error::Error>> {", "Ok(())", "}"];
    let mut checked = 0;
    for line in code
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !wrapper.contains(l))
    {
        assert!(
            doc.iter().any(|d| d == line),
            "README line not in the lib.rs doc test: {line}"
        );
        checked += 1;
    }
    assert!(checked >= 15, "only {checked} lines compared");
}
