//! The gRPC side end to end, with real tonic servers and clients: the example service as its
//! clients see it (`service`), and seawall's retry and breaker layers around a tonic client
//! (`stack`). One test binary for both, since each one compiles the example and links tonic's
//! whole transport.

#[path = "../../examples/llm_stream.rs"]
#[allow(dead_code)] // `main`, and what one of the two modules does not use.
mod llm_stream;

mod service;
mod stack;
