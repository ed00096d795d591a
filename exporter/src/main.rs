fn main() {
    println!("prjquota-exporter {}", env!("CARGO_PKG_VERSION"));
}
