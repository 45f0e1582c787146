//! Compiles the CSI spec's csi.proto (proto/, vendored) into the gRPC servers and messages of
//! `shardfs csi`, with protox, so that building needs no protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/csi.proto");
    let descriptors = protox::compile(["csi.proto"], ["proto"])?;
    tonic_prost_build::configure().build_client(false).compile_fds(descriptors)?;
    Ok(())
}
