#![allow(missing_docs)]
mod common;
use common::{Chunks, chat_request, drain, run_request, sse_response};

#[tokio::test]
async fn probe() {
    let bodies = [
        concat!(
            "data: {\"id\":\"gen-1\",\"object\":\"chat.completion.chunk\",\"model\":\"openai/gpt-4o\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hel\"},\"finish_reason\":null}]}\n\n",
            "data: {\"id\":\"gen-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"openai/gpt-4o\",\"provider\":\"openai\",\"error\":{\"code\":\"server_error\",\"message\":\"Provider disconnected unexpectedly\"},\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},\"finish_reason\":\"error\"}]}\n\n",
            "data: [DONE]\n\n"
        ),
        concat!(
            "data: {\"id\":\"gen-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"openai/gpt-4o\",\"provider\":\"openai\",\"error\":{\"code\":502,\"message\":\"Provider returned error\"},\"choices\":[{\"index\":0,\"delta\":{\"content\":\"\"},\"finish_reason\":\"error\"}]}\n\n",
            "data: [DONE]\n\n"
        ),
        concat!(
            ": OPENROUTER PROCESSING\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n"
        ),
    ];
    for b in bodies {
        match run_request(chat_request(true), sse_response(Chunks::one(b.to_owned()))).await {
            Ok(resp) => {
                let (_, e) = drain(resp.into_body()).await;
                println!(
                    "OK then body err {:?}",
                    e.map(|e| (e.class(), e.message().to_owned()))
                );
            }
            Err(e) => println!("ERR {:?} {}", e.class(), e.message()),
        }
    }
}
