//! Every row of the README's failure-class table, in both wire formats, through the layer.

mod common;

use http::HeaderMap;
use seawall_classify::{
    AnthropicClassifier, AutoClassifier, Classifier, ErrorResponse, OpenAiClassifier,
    StatusClassifier,
};
use seawall_core::FailureClass::{self, *};

fn openai(message: &str, ty: &str, code: &str) -> String {
    let q = |s: &str| {
        if s.is_empty() {
            "null".to_owned()
        } else {
            serde_json::to_string(s).unwrap()
        }
    };
    format!(
        r#"{{"error":{{"message":{},"type":{},"param":null,"code":{}}}}}"#,
        q(message),
        q(ty),
        q(code)
    )
}

fn anthropic(ty: &str, message: &str) -> String {
    serde_json::json!({
        "type": "error",
        "error": {"type": ty, "message": message},
        "request_id": "req_011CSHoEeqs5C35K2UUqR7Fy"
    })
    .to_string()
}

/// (status, body, class, code or type the error must keep)
fn openai_rows() -> Vec<(u16, String, FailureClass, &'static str)> {
    vec![
        (429, openai("Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Used 29000, Requested 2000. Please try again in 2s. You can increase your rate limit by adding a payment method at https://platform.openai.com/account/billing.", "tokens", "rate_limit_exceeded"), RateLimited, "rate_limit_exceeded"),
        (429, openai("You exceeded your current quota, please check your plan and billing details.", "insufficient_quota", "insufficient_quota"), QuotaExhausted, "insufficient_quota"),
        (429, openai("You have reached your enforced spend limit.", "invalid_request_error", "enforced_spend_limit_reached"), QuotaExhausted, "enforced_spend_limit_reached"),
        (402, openai("Insufficient Balance", "unknown_error", "invalid_request_error"), QuotaExhausted, "invalid_request_error"),
        (402, r#"{"error":{"message":"Payment Required"}}"#.to_owned(), QuotaExhausted, ""),
        (429, r#"{"error":{"message":"You exceeded your current quota, please check your plan and billing details."}}"#.to_owned(), QuotaExhausted, ""),
        // A per-minute quota that says when to come back is a rate limit (Gemini's compatible API).
        (429, r#"[{"error":{"code":429,"message":"You exceeded your current quota, please check your plan and billing details. Please retry in 33.7s.","status":"RESOURCE_EXHAUSTED"}}]"#.to_owned(), RateLimited, "429"),
        (400, openai("This model's maximum context length is 128000 tokens. However, your messages resulted in 130412 tokens. Please reduce the length of the messages.", "invalid_request_error", "context_length_exceeded"), ContextLengthExceeded, "context_length_exceeded"),
        (400, r#"{"object":"error","message":"This model's maximum context length is 4096 tokens. However, you requested 5000 tokens.","type":"BadRequestError","param":null,"code":400}"#.to_owned(), ContextLengthExceeded, "BadRequestError"),
        (413, openai("Request too large for gpt-4o.", "invalid_request_error", "request_too_large"), ContextLengthExceeded, "request_too_large"),
        // One request over the key's whole tokens per minute: OpenAI says so with a 429, Groq
        // with a 413. No wait lets it through, so it is not a rate limit to wait out.
        (429, openai("Request too large for gpt-4o in organization org-x on tokens per min (TPM): Limit 30000, Requested 50000. The input or output tokens must be reduced in order to run successfully. Visit https://platform.openai.com/account/rate-limits to learn more.", "tokens", "rate_limit_exceeded"), ContextLengthExceeded, "rate_limit_exceeded"),
        (413, openai("Request too large for model `llama-3.1-8b-instant` in organization `org_x` service tier `on_demand` on tokens per minute (TPM): Limit 6000, Requested 7000, please reduce your message size and try again.", "tokens", "rate_limit_exceeded"), ContextLengthExceeded, "rate_limit_exceeded"),
        (400, openai("Your request was rejected as a result of our safety system.", "invalid_request_error", "content_policy_violation"), ContentFiltered, "content_policy_violation"),
        (400, r#"{"error":{"message":"The response was filtered due to the prompt triggering Azure OpenAI's content management policy.","type":null,"param":"prompt","code":"content_filter","status":400,"innererror":{"code":"ResponsibleAIPolicyViolation"}}}"#.to_owned(), ContentFiltered, "content_filter"),
        (400, openai("Invalid value for 'temperature': must be <= 2.", "invalid_request_error", "invalid_value"), InvalidRequest, "invalid_value"),
        (422, r#"{"detail":[{"loc":["body","messages"],"msg":"field required","type":"value_error.missing"}]}"#.to_owned(), InvalidRequest, ""),
        (401, openai("Incorrect API key provided: sk-proj-abcdefghijkl. You can find your API key at https://platform.openai.com/account/api-keys.", "invalid_request_error", "invalid_api_key"), Authentication, "invalid_api_key"),
        (401, r#"{"error":{"code":"401","message":"Access denied due to invalid subscription key or wrong API endpoint."}}"#.to_owned(), Authentication, "401"),
        (403, openai("Country, region, or territory not supported", "request_forbidden", "unsupported_country_region_territory"), PermissionDenied, "unsupported_country_region_territory"),
        (404, openai("The model `gpt-5-turbo` does not exist or you do not have access to it.", "invalid_request_error", "model_not_found"), NotFound, "model_not_found"),
        (404, r#"{"error":{"code":"DeploymentNotFound","message":"The API deployment for this resource does not exist."}}"#.to_owned(), NotFound, "DeploymentNotFound"),
        (408, openai("Request timed out.", "", ""), RequestTimeout, ""),
        (409, openai("Another request is in progress.", "", "conflict"), Conflict, "conflict"),
        (500, openai("The server had an error while processing your request. Sorry about that!", "server_error", ""), ServerError, "server_error"),
        (502, openai("Bad gateway.", "server_error", ""), ServerError, "server_error"),
        (503, openai("The engine is currently overloaded, please try again later", "server_error", ""), Overloaded, "server_error"),
        (503, openai("Server overloaded", "", ""), Overloaded, ""),
        (500, openai("The server is overloaded or not ready yet.", "server_error", ""), Overloaded, "server_error"),
        (504, openai("Gateway timeout.", "", ""), UpstreamTimeout, ""),
        (418, openai("I'm a teapot", "", ""), InvalidRequest, ""),
        (599, openai("Something odd", "", ""), ServerError, ""),
    ]
}

fn anthropic_rows() -> Vec<(u16, String, FailureClass, &'static str)> {
    vec![
        (
            429,
            anthropic(
                "rate_limit_error",
                "Number of request tokens has exceeded your per-minute rate limit",
            ),
            RateLimited,
            "rate_limit_error",
        ),
        (
            402,
            anthropic(
                "billing_error",
                "There is an issue with your account's billing.",
            ),
            QuotaExhausted,
            "billing_error",
        ),
        (
            400,
            anthropic(
                "invalid_request_error",
                "Your credit balance is too low to access the Anthropic API. Please go to Plans & Billing to upgrade or purchase credits.",
            ),
            QuotaExhausted,
            "invalid_request_error",
        ),
        (
            400,
            anthropic(
                "invalid_request_error",
                "You have reached your specified API usage limits. You will regain access on 2025-07-01 at 00:00 UTC.",
            ),
            QuotaExhausted,
            "invalid_request_error",
        ),
        (
            409,
            anthropic("conflict_error", "Conflict"),
            Conflict,
            "conflict_error",
        ),
        (
            400,
            anthropic(
                "invalid_request_error",
                "prompt is too long: 208310 tokens > 200000 maximum",
            ),
            ContextLengthExceeded,
            "invalid_request_error",
        ),
        (
            400,
            anthropic(
                "invalid_request_error",
                "input length and `max_tokens` exceed context limit: 197000 + 8192 > 200000",
            ),
            ContextLengthExceeded,
            "invalid_request_error",
        ),
        (
            413,
            anthropic(
                "request_too_large",
                "Request exceeds the maximum allowed number of bytes.",
            ),
            ContextLengthExceeded,
            "request_too_large",
        ),
        (
            400,
            anthropic(
                "invalid_request_error",
                "Output blocked by content filtering policy",
            ),
            ContentFiltered,
            "invalid_request_error",
        ),
        (
            400,
            anthropic(
                "invalid_request_error",
                "messages: roles must alternate between \"user\" and \"assistant\"",
            ),
            InvalidRequest,
            "invalid_request_error",
        ),
        (
            401,
            anthropic("authentication_error", "invalid x-api-key"),
            Authentication,
            "authentication_error",
        ),
        (
            403,
            anthropic(
                "permission_error",
                "Your API key does not have permission to use the specified resource.",
            ),
            PermissionDenied,
            "permission_error",
        ),
        (
            404,
            anthropic("not_found_error", "model: claude-9"),
            NotFound,
            "not_found_error",
        ),
        (
            408,
            anthropic("timeout_error", "Request timed out"),
            RequestTimeout,
            "timeout_error",
        ),
        (
            409,
            anthropic("invalid_request_error", "conflict"),
            Conflict,
            "invalid_request_error",
        ),
        (
            500,
            anthropic("api_error", "Internal server error"),
            ServerError,
            "api_error",
        ),
        (
            502,
            anthropic("api_error", "Bad gateway"),
            ServerError,
            "api_error",
        ),
        (
            529,
            anthropic("overloaded_error", "Overloaded"),
            Overloaded,
            "overloaded_error",
        ),
        (
            503,
            anthropic("overloaded_error", "Overloaded"),
            Overloaded,
            "overloaded_error",
        ),
        (
            500,
            anthropic("overloaded_error", "Overloaded"),
            Overloaded,
            "overloaded_error",
        ),
        (
            504,
            anthropic("timeout_error", "Request timed out"),
            UpstreamTimeout,
            "timeout_error",
        ),
        (
            500,
            anthropic("timeout_error", "Stream timed out"),
            UpstreamTimeout,
            "timeout_error",
        ),
        (
            422,
            anthropic("invalid_request_error", "unprocessable"),
            InvalidRequest,
            "invalid_request_error",
        ),
        (
            460,
            anthropic("invalid_request_error", "odd"),
            InvalidRequest,
            "invalid_request_error",
        ),
    ]
}

fn check(
    format: &str,
    classifier: &impl Classifier,
    rows: &[(u16, String, FailureClass, &'static str)],
) {
    let headers = HeaderMap::new();
    for (status, body, want, name) in rows {
        let status_code = http::StatusCode::from_u16(*status).unwrap();
        let err = classifier.classify_response(&ErrorResponse::new(
            status_code,
            &headers,
            body.as_bytes(),
        ));
        assert_eq!(err.class(), *want, "{format} {status} {body}");
        assert_eq!(err.status(), Some(status_code));
        if !name.is_empty() {
            assert!(
                err.code() == Some(name) || err.error_type() == Some(name),
                "{format} {status}: kept {:?}/{:?}, want {name}",
                err.code(),
                err.error_type()
            );
        }
        assert!(!err.message().is_empty());
    }
}

#[test]
fn openai_format_every_row() {
    check("openai/auto", &AutoClassifier, &openai_rows());
    check("openai", &OpenAiClassifier, &openai_rows());
}

#[test]
fn anthropic_format_every_row() {
    check("anthropic/auto", &AutoClassifier, &anthropic_rows());
    check("anthropic", &AnthropicClassifier, &anthropic_rows());
}

/// Prompt-too-long errors of Gemini and of the self-hosted servers, as they send them: a code
/// that says only "bad request", the window in the words.
fn context_window_rows() -> Vec<(u16, String, FailureClass, &'static str)> {
    let flat = |message: &str| {
        serde_json::json!({"object": "error", "message": message, "type": "BadRequestError", "param": null, "code": 400})
            .to_string()
    };
    vec![
        // Gemini's OpenAI-compatible endpoint (an array) and its own API.
        (400, r#"[{"error":{"code":400,"message":"The input token count (1200293) exceeds the maximum number of tokens allowed (1048576).","errors":[{"message":"The input token count (1200293) exceeds the maximum number of tokens allowed (1048576).","domain":"global","reason":"badRequest"}],"status":"INVALID_ARGUMENT"}}]"#.to_owned(), ContextLengthExceeded, "400"),
        (400, r#"{"error":{"code":400,"message":"The input token count (3475108) exceeds the maximum number of tokens allowed (1048576).","status":"INVALID_ARGUMENT"}}"#.to_owned(), ContextLengthExceeded, "400"),
        // llama.cpp's server.
        (400, r#"{"error":{"code":400,"message":"request (4476 tokens) exceeds the available context size (4096 tokens)","type":"exceed_context_size_error","n_prompt_tokens":4476,"n_ctx":4096}}"#.to_owned(), ContextLengthExceeded, "exceed_context_size_error"),
        (400, r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"invalid_request_error"}}"#.to_owned(), ContextLengthExceeded, "invalid_request_error"),
        // vLLM, three wordings over its versions.
        (400, flat("Prompt length of 5016 is longer than the maximum model length of 4096."), ContextLengthExceeded, "BadRequestError"),
        (400, flat("The decoder prompt (length 16476) is longer than the maximum model length of 16384. Make sure that `max_model_len` is no smaller than the number of text tokens plus multimodal tokens."), ContextLengthExceeded, "BadRequestError"),
        (400, flat("The prompt (total length 25938) is too long to fit into the model (context length 4096). Make sure that `max_model_len` is no smaller than the number of text tokens plus multimodal tokens."), ContextLengthExceeded, "BadRequestError"),
        // SGLang.
        (400, flat("The input (61709 tokens) is longer than the model's context length (40960 tokens)."), ContextLengthExceeded, "BadRequestError"),
        (400, flat("Input length (160062 tokens) exceeds the maximum allowed length (59862 tokens)."), ContextLengthExceeded, "BadRequestError"),
        // LM Studio.
        (400, r#"{"error":"The number of tokens to keep from the initial prompt is greater than the context length. Try to load the model with a larger context length, or provide a shorter input"}"#.to_owned(), ContextLengthExceeded, ""),
        // Text Generation Inference (422, its error a string).
        (422, r#"{"error":"Input validation error: `inputs` tokens + `max_new_tokens` must be <= 2048. Given: 1244 `inputs` tokens and 1000 `max_new_tokens`","error_type":"validation"}"#.to_owned(), ContextLengthExceeded, ""),
        (422, r#"{"error":"Input validation error: `inputs` must have less than 4096 tokens. Given: 4545","error_type":"validation"}"#.to_owned(), ContextLengthExceeded, ""),
        // xAI.
        (400, openai("This model's maximum prompt length is 131072 but the request contains 150000 tokens.", "invalid_request_error", ""), ContextLengthExceeded, "invalid_request_error"),
        // A field's own length is not the window: a larger model would refuse it the same way.
        (400, openai("Invalid 'messages[0].name': string too long. Expected a string with maximum length 64, but got a string with length 80 instead.", "invalid_request_error", "string_above_max_length"), InvalidRequest, "string_above_max_length"),
        (400, flat("max_tokens must be at least 1, got 0."), InvalidRequest, "BadRequestError"),
    ]
}

#[test]
fn prompt_too_long_errors_of_gemini_and_self_hosted_servers_need_a_larger_window() {
    check("context/auto", &AutoClassifier, &context_window_rows());
    check("context/openai", &OpenAiClassifier, &context_window_rows());
}

/// Errors whose status says "bad request" or "too many requests" while their names or words say
/// more: the key, the region or the model refused (another key, provider or model may serve
/// the call), a limit of the day (no retry helps), a prompt too long in Cohere's words, and a
/// Google error object met without its status.
fn refusal_rows() -> Vec<(u16, String, FailureClass, &'static str)> {
    let google = |code: u16, status: &str, message: &str, reason: Option<&str>| {
        let details = match reason {
            Some(r) => {
                serde_json::json!([{"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": r, "domain": "googleapis.com", "metadata": {"service": "generativelanguage.googleapis.com"}}])
            }
            None => serde_json::json!([]),
        };
        serde_json::json!({"error": {"code": code, "message": message, "status": status, "details": details}}).to_string()
    };
    let cohere = |message: &str| serde_json::json!({"message": message}).to_string();
    vec![
        // Gemini answers a bad key with 400 INVALID_ARGUMENT; only the ErrorInfo names it.
        (400, google(400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key.", Some("API_KEY_INVALID")), Authentication, "400"),
        (400, google(400, "FAILED_PRECONDITION", "User location is not supported for the API use.", None), PermissionDenied, "400"),
        (400, google(400, "FAILED_PRECONDITION", "Gemini API free tier is not available in your country. Please enable billing on your project in Google AI Studio.", None), PermissionDenied, "400"),
        // OpenRouter's moderation refuses the prompt with a 403: not the key, the content.
        (403, r#"{"error":{"code":403,"message":"meta-llama/llama-guard requires moderation on OpenRouter. Your input was flagged for \"violence\"","metadata":{"reasons":["violence"],"flagged_input":"...","provider_name":"OpenAI","model_slug":"openai/gpt-4o"}}}"#.to_owned(), ContentFiltered, "403"),
        // A 403 that says nothing of content stays a refusal of the caller.
        (403, openai("Country, region, or territory not supported", "request_forbidden", "unsupported_country_region_territory"), PermissionDenied, "unsupported_country_region_territory"),
        // OpenAI's models an organization must be verified to stream: another model serves it.
        (400, openai("Your organization must be verified to stream this model. Please go to: https://platform.openai.com/settings/organization/general and click on Verify Organization.", "invalid_request_error", "unsupported_value"), PermissionDenied, "unsupported_value"),
        // A malformed request stays one.
        (400, google(400, "INVALID_ARGUMENT", "* GenerateContentRequest.contents: contents is not specified", Some("BAD_REQUEST")), InvalidRequest, "400"),
        // xAI refuses a bad key with a 400 whose code names only the argument; Cohere with a 498.
        (400, r#"{"code":"Client specified an invalid argument","error":"Incorrect API key provided: xa***yz. You can obtain an API key from https://console.x.ai."}"#.to_owned(), Authentication, ""),
        (498, r#"{"message":"invalid api token"}"#.to_owned(), Authentication, ""),
        // Groq's retired model: another model serves the call.
        (400, openai("The model `mixtral-8x7b-32768` has been decommissioned and is no longer supported.", "invalid_request_error", "model_decommissioned"), NotFound, "model_decommissioned"),
        // A router's unknown model, sent as a 400.
        (400, openai("The requested model 'gpt-9' does not exist.", "invalid_request_error", "model_not_found"), NotFound, "model_not_found"),
        // OpenRouter's daily cap on free models: no hint of when, so not a rate limit to wait out.
        (429, r#"{"error":{"code":429,"message":"Rate limit exceeded: free-models-per-day. Add 10 credits to unlock 1000 free model requests per day","metadata":{"headers":{"X-RateLimit-Limit":"50","X-RateLimit-Remaining":"0","X-RateLimit-Reset":"1741305600000"}}}}"#.to_owned(), QuotaExhausted, "429"),
        // Groq's rolling daily window says when to come back: a rate limit.
        (429, openai("Rate limit reached for model `llama-3.3-70b-versatile` in organization `org_x` service tier `on_demand` on requests per day (RPD): Limit 14400, Used 14400, Requested 1. Please try again in 6s.", "requests", "rate_limit_exceeded"), RateLimited, "rate_limit_exceeded"),
        (400, cohere("too many tokens: total number of tokens in the prompt cannot exceed 4081 - received 4500. Try using a shorter prompt, or enabling prompt truncating."), ContextLengthExceeded, ""),
        (400, cohere("too many tokens: size limit exceeded by 11738 tokens. Try using shorter or fewer inputs, or setting prompt_truncation='AUTO'."), ContextLengthExceeded, ""),
        // Google error objects in a 200 (a stream's error), their status a name only.
        (200, r#"{"error":{"message":"The service is currently unavailable.","status":"UNAVAILABLE"}}"#.to_owned(), Overloaded, ""),
        (200, r#"{"error":{"message":"Deadline expired before operation could complete.","status":"DEADLINE_EXCEEDED"}}"#.to_owned(), UpstreamTimeout, ""),
    ]
}

#[test]
fn errors_that_refuse_the_key_the_region_or_the_day_say_so_whatever_their_status() {
    check("refusal/auto", &AutoClassifier, &refusal_rows());
    check("refusal/openai", &OpenAiClassifier, &refusal_rows());

    // A limit of the day with a server's hint of when to come back: a rate limit, retried
    // after it.
    let day = r#"{"error":{"code":429,"message":"Rate limit exceeded: free-models-per-day."}}"#;
    let mut headers = HeaderMap::new();
    headers.insert("retry-after", http::HeaderValue::from_static("30"));
    let err = AutoClassifier.classify_response(&ErrorResponse::new(
        http::StatusCode::TOO_MANY_REQUESTS,
        &headers,
        day.as_bytes(),
    ));
    assert_eq!(err.class(), RateLimited);
    assert_eq!(err.retry_after(), Some(std::time::Duration::from_secs(30)));
}

/// The OpenAI-compatible providers that say more in their words and business codes than in
/// their status: Zhipu / Z.ai sends a spent balance and a locked account as 429s (its codes
/// 1113, 1112), in Chinese or in English; Moonshot a spent quota as a 403 and its overload as
/// a 429; Alibaba's DashScope a spent balance as a 400 (`Arrearage`). And the prompt-too-long
/// wordings of Kimi, Z.ai, DashScope, Groq, Bedrock and the routers.
fn provider_words_rows() -> Vec<(u16, String, FailureClass, &'static str)> {
    let zhipu = |code: &str, message: &str| {
        serde_json::json!({"error": {"code": code, "message": message}}).to_string()
    };
    let typed = |ty: &str, message: &str| {
        serde_json::json!({"error": {"message": message, "type": ty}}).to_string()
    };
    vec![
        // Z.ai / Zhipu: a spent balance (1113) is no rate limit, whatever the status says.
        (429, zhipu("1113", "您的账户已欠费，请充值后重试。"), QuotaExhausted, "1113"),
        (429, zhipu("1113", "余额不足或无可用资源包,请充值。"), QuotaExhausted, "1113"),
        (429, zhipu("1113", "Your account is in arrears, please recharge and try again"), QuotaExhausted, "1113"),
        (429, anthropic("1113", "Insufficient balance or no resource package. Please recharge."), QuotaExhausted, "1113"),
        // ... nor is a locked account (1112, 1121): another key or provider may serve.
        (429, zhipu("1112", "Your account has been locked, please contact customer service to unlock"), PermissionDenied, "1112"),
        (429, zhipu("1121", "Account has irregular activities and has been locked"), PermissionDenied, "1121"),
        // Its plan's windows of use (1308: 5 hours; 1310: a week or a month) are not over within
        // any call's retries; their reset times are in its own zone, not read as delays.
        (429, zhipu("1308", "Usage limit reached for 5 hour. Your limit will reset at 2026-09-09 05:38:28"), QuotaExhausted, "1308"),
        (429, zhipu("1308", "已达到 5 小时的使用上限。您的限额将在 2026-01-22 17:57:30 重置。"), QuotaExhausted, "1308"),
        (429, zhipu("1310", "Weekly/Monthly Limit Exhausted. Your limit will reset at 2026-08-14T00:00:00Z"), QuotaExhausted, "1310"),
        // Its fair-usage restriction (1313) lasts until the user asks.
        (429, zhipu("1313", "Your account's current usage pattern does not comply with the Fair Usage Policy, and your request frequency has been limited. For details, please refer to the Subscription Service Agreement. To restore access, please submit a request."), PermissionDenied, "1313"),
        // Its concurrency limit (1302) is one.
        (429, zhipu("1302", "High concurrency usage of this API, please reduce concurrency or contact customer service to increase limits"), RateLimited, "1302"),
        // Its content safety (1301), in both languages, and its prompt too long (1261).
        (400, zhipu("1301", "System detected potentially unsafe or sensitive content in input or generation. Please avoid using prompts that may generate sensitive content. Thank you for your cooperation."), ContentFiltered, "1301"),
        (400, zhipu("1301", "系统检测到输入或生成内容可能包含不安全或敏感内容，请您避免输入易产生敏感内容的提示语，感谢您的配合。"), ContentFiltered, "1301"),
        (400, zhipu("1261", "Prompt too long"), ContextLengthExceeded, "1261"),
        // A limit of the minute, whatever its words, stays a rate limit.
        (429, openai("Request limit exhausted for this minute.", "", ""), RateLimited, ""),
        // Ollama's cloud: a session's usage.
        (429, r#"{"error":"you (someone) have reached your session usage limit, please wait or upgrade to continue"}"#.to_owned(), QuotaExhausted, ""),
        // Moonshot: a spent quota as a 403, its overload as a 429, its rate limit as a 429.
        (403, typed("exceeded_current_quota_error", "Your account org-x <ak-y> is not active, organization <org-x> exceeded current quota, please check your plan and billing details"), QuotaExhausted, "exceeded_current_quota_error"),
        (429, typed("exceeded_current_quota_error", "Your account org-x <ak-y> is suspended due to insufficient balance, please recharge your account or check your plan and billing details"), QuotaExhausted, "exceeded_current_quota_error"),
        (429, typed("engine_overloaded_error", "The engine is currently overloaded, please try again later"), Overloaded, "engine_overloaded_error"),
        (429, typed("rate_limit_reached_error", "Your account org-x <ak-y> request reached organization TPM rate limit, current: 1410, limit: 100"), RateLimited, "rate_limit_reached_error"),
        (400, typed("invalid_request_error", "Invalid request: Your request exceeded model token limit: 131072 (requested: 150000)"), ContextLengthExceeded, "invalid_request_error"),
        // DashScope (Qwen's compatible mode).
        (400, openai("Access denied, please make sure your account is in good standing. For details, see: https://help.aliyun.com/zh/model-studio/error-code#overdue-payment", "Arrearage", "Arrearage"), QuotaExhausted, "Arrearage"),
        (400, openai("Input data may contain inappropriate content.", "data_inspection_failed", "data_inspection_failed"), ContentFiltered, "data_inspection_failed"),
        (400, openai("<400> InternalError.Algo.InvalidParameter: Range of input length should be [1, 129024]", "invalid_request_error", "invalid_parameter_error"), ContextLengthExceeded, "invalid_parameter_error"),
        // MiniMax's spent balance as a 500 (its Anthropic-format endpoint), a relay's as a 403.
        (500, anthropic("api_error", "insufficient balance (1008)"), QuotaExhausted, "api_error"),
        (403, r#"{"code":"INSUFFICIENT_BALANCE","message":"Insufficient account balance"}"#.to_owned(), QuotaExhausted, "INSUFFICIENT_BALANCE"),
        // SiliconFlow's model that needs a paid balance, as a 403 with a numeric code.
        (403, r#"{"code":30011,"message":"The selected model requires paid balance. Your paid balance is insufficient. Please top up and try again.","data":null}"#.to_owned(), QuotaExhausted, ""),
        // OpenRouter's key past its own spend cap, as a 403.
        (403, r#"{"error":{"message":"Key limit exceeded (monthly limit). Manage it using https://openrouter.ai/settings/keys","code":403}}"#.to_owned(), QuotaExhausted, "403"),
        // A gateway's spent account as a 403.
        (403, r#"{"error":{"message":"Access denied due to overdue account"}}"#.to_owned(), QuotaExhausted, ""),
        // OpenAI's older overload, sent as a 429 with a server error's type.
        (429, openai("That model is currently overloaded with other requests. You can retry your request, or contact us through our help center at help.openai.com if the error persists.", "server_error", ""), Overloaded, "server_error"),
        // Prompt-too-long wordings whose code says only "bad request".
        (400, openai("Please reduce the length of the messages or completion.", "invalid_request_error", ""), ContextLengthExceeded, "invalid_request_error"),
        (400, openai("Input length 140000 exceeds the maximum allowed input length of 131072 tokens.", "", ""), ContextLengthExceeded, ""),
        (400, openai("prompt token count of 130000 exceeds the limit of 128000", "invalid_request_error", ""), ContextLengthExceeded, "invalid_request_error"),
        (400, r#"{"message":"Too many input tokens. Max input tokens: 8192, request input token count: 9279"}"#.to_owned(), ContextLengthExceeded, ""),
        // Bedrock's throttling speaks of tokens too, and stays a rate limit.
        (429, r#"{"message":"Too many tokens, please wait before trying again."}"#.to_owned(), RateLimited, ""),
        // xAI's spent credits (its error a string beside a gRPC status's words), Fireworks'
        // suspended account (a 412), a LiteLLM proxy's budget (a 429, or a 400 before).
        (429, r#"{"code":"Some resource has been exhausted","error":"Your team abc has either used all available credits or reached its monthly spending limit. To continue making API requests, please purchase more credits or raise your spending limit."}"#.to_owned(), QuotaExhausted, ""),
        (412, r#"{"error":{"message":"Account acme is suspended, possibly due to reaching the monthly spending limit or failure to pay past invoices. Please go to https://fireworks.ai/account/billing for more information.","param":null,"code":"PRECONDITION_FAILED","type":"error"},"request_id":"r1"}"#.to_owned(), QuotaExhausted, "PRECONDITION_FAILED"),
        (429, openai("Budget has been exceeded! Current cost: 10.51, Max budget: 10.00", "budget_exceeded", "429"), QuotaExhausted, "budget_exceeded"),
        (400, openai("ExceededBudget: End User=ishaan3 over budget. Spend=0.00089, Budget=0.0001", "budget_exceeded", "400"), QuotaExhausted, "budget_exceeded"),
        // Capacity run out: Mistral's 429 (its type says only "invalid request"), Cloudflare's
        // 429, Groq's 498 for its flex tier.
        (429, r#"{"object":"error","message":"Service tier capacity exceeded for this model.","type":"invalid_request_error","param":null,"code":null}"#.to_owned(), Overloaded, "invalid_request_error"),
        (429, r#"{"errors":[{"message":"Capacity temporarily exceeded, please try again.","code":3040}],"success":false,"result":{},"messages":[]}"#.to_owned(), Overloaded, ""),
        (498, openai("Flex Tier Capacity Exceeded", "", ""), Overloaded, ""),
        // A rate limit whose words mention an overload is still the rate limit its code names.
        (429, openai("Rate limit reached: the servers are overloaded with your requests.", "requests", "rate_limit_exceeded"), RateLimited, "rate_limit_exceeded"),
        // Amazon Bedrock's `{"message": ...}`: its model failing (424, "Retry your request"
        // for a broken stream) is the server's failure, not a bad request.
        (424, r#"{"message":"Received error from model"}"#.to_owned(), ServerError, ""),
        (424, r#"{"message":"An error occurred while streaming the response. Retry your request."}"#.to_owned(), ServerError, ""),
        (429, r#"{"message":"Too many requests, please wait before trying again."}"#.to_owned(), RateLimited, ""),
        (503, r#"{"message":"Model is getting throttled. Try your request again."}"#.to_owned(), Overloaded, ""),
        (400, r#"{"message":"Input is too long for requested model."}"#.to_owned(), ContextLengthExceeded, ""),
    ]
}

#[test]
fn a_spent_balance_a_locked_account_or_an_overload_is_read_in_the_providers_own_words() {
    check("words/auto", &AutoClassifier, &provider_words_rows());
    check("words/openai", &OpenAiClassifier, &provider_words_rows());
}

/// A Gemini 429 as its API sends it: Google's error model, the quota that ran out named in a
/// `QuotaFailure`, the delay in a `RetryInfo`.
fn gemini_429(message: &str, quota_id: &str, retry_delay: &str) -> String {
    serde_json::json!([{"error": {
        "code": 429,
        "message": message,
        "status": "RESOURCE_EXHAUSTED",
        "details": [
            {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{
                "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
                "quotaId": quota_id,
                "quotaValue": "10"
            }]},
            {"@type": "type.googleapis.com/google.rpc.Help", "links": [{"description": "Learn more", "url": "https://ai.google.dev/gemini-api/docs/rate-limits"}]},
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": retry_delay}
        ]
    }}])
    .to_string()
}

#[test]
fn gemini_quota_errors_read_the_retry_info_and_the_quota_of_the_day() {
    use std::time::Duration;
    let headers = HeaderMap::new();
    let classify = |body: &str| {
        AutoClassifier.classify_response(&ErrorResponse::new(
            http::StatusCode::TOO_MANY_REQUESTS,
            &headers,
            body.as_bytes(),
        ))
    };
    let quota = "You exceeded your current quota, please check your plan and billing details.";

    let per_minute = "GenerateRequestsPerMinutePerProjectPerModel-FreeTier";
    let per_day = "GenerateRequestsPerDayPerProjectPerModel-FreeTier";
    let retry_in = |s: &str| format!("{quota} Please retry in {s}.");
    for (message, quota_id, delay, class, hint) in [
        // A per-minute quota whose delay is only in the details: a rate limit, retried after it.
        (
            quota.to_owned(),
            per_minute,
            "33s",
            RateLimited,
            Some(Duration::from_secs(33)),
        ),
        // Fractions, as protobuf writes them; the structured delay beats the message's words.
        (
            retry_in("40s"),
            per_minute,
            "1.250s",
            RateLimited,
            Some(Duration::from_millis(1250)),
        ),
        // The day's quota: final until the day turns, whatever delay comes with it.
        (
            retry_in("16.2s"),
            per_day,
            "16s",
            QuotaExhausted,
            Some(Duration::from_secs(16)),
        ),
    ] {
        let err = classify(&gemini_429(&message, quota_id, delay));
        assert_eq!(err.class(), class, "{quota_id} {delay}");
        assert_eq!(err.retry_after(), hint, "{quota_id} {delay}");
    }

    // A delay that is no duration is no delay, and no panic; the quota words then decide.
    for bad in ["-5s", "1e400s", "33", "s", "NaNs", "", "3 s", "1..5s"] {
        let err = classify(&gemini_429(quota, per_minute, bad));
        assert_eq!(err.retry_after(), None, "{bad:?}");
        assert_eq!(err.class(), QuotaExhausted, "{bad:?}");
    }
    // A delay of years is held to a day, as every server hint is.
    let err = classify(&gemini_429(quota, per_minute, "99999999999999999999999s"));
    assert_eq!(err.retry_after(), Some(seawall_classify::hints::MAX_HINT));

    // Without details: Gemini's shared-capacity 429 is a rate limit, as before.
    let err = classify(
        r#"{"error":{"code":429,"message":"Resource has been exhausted (e.g. check quota).","status":"RESOURCE_EXHAUSTED"}}"#,
    );
    assert_eq!(err.class(), RateLimited);
    assert_eq!(err.retry_after(), None);
}

#[test]
fn status_only_classifier_ignores_the_body() {
    let headers = HeaderMap::new();
    for (status, want) in [
        (400, InvalidRequest),
        (401, Authentication),
        (402, QuotaExhausted),
        (403, PermissionDenied),
        (404, NotFound),
        (408, RequestTimeout),
        (409, Conflict),
        (413, ContextLengthExceeded),
        (422, InvalidRequest),
        (429, RateLimited),
        (451, InvalidRequest),
        (500, ServerError),
        (502, ServerError),
        (503, Overloaded),
        (504, UpstreamTimeout),
        (529, Overloaded),
        (599, ServerError),
    ] {
        // The body says quota, but the status-only classifier reads the status alone.
        let body = openai(
            "You exceeded your current quota",
            "insufficient_quota",
            "insufficient_quota",
        );
        let s = http::StatusCode::from_u16(status).unwrap();
        let err =
            StatusClassifier.classify_response(&ErrorResponse::new(s, &headers, body.as_bytes()));
        assert_eq!(err.class(), want, "{status}");
        assert_eq!(err.code(), None);
        assert!(err.message().contains("exceeded your current quota"));
    }
}

#[tokio::test]
async fn through_the_layer_both_formats() {
    let rows = openai_rows()
        .into_iter()
        .chain(anthropic_rows())
        .chain(context_window_rows());
    for (status, body, want, _) in rows {
        let err = common::error_of(status, &[("content-type", "application/json")], &body).await;
        assert_eq!(err.class(), want, "{status} {body}");
    }
}

#[tokio::test]
async fn request_ids_from_headers_and_body() {
    let err = common::error_of(
        500,
        &[("x-request-id", "req_openai_1")],
        &openai("boom", "server_error", ""),
    )
    .await;
    assert_eq!(err.request_id(), Some("req_openai_1"));
    let err = common::error_of(
        529,
        &[("request-id", "req_hdr")],
        &anthropic("overloaded_error", "Overloaded"),
    )
    .await;
    assert_eq!(err.request_id(), Some("req_hdr"));
    let err = common::error_of(529, &[], &anthropic("overloaded_error", "Overloaded")).await;
    assert_eq!(err.request_id(), Some("req_011CSHoEeqs5C35K2UUqR7Fy"));
}

#[tokio::test]
async fn credentials_in_error_bodies_are_redacted() {
    let err = common::error_of(
        401,
        &[],
        &openai(
            "Incorrect API key provided: sk-proj-abcdefghijkl1234.",
            "invalid_request_error",
            "invalid_api_key",
        ),
    )
    .await;
    let shown = format!("{err} {err:?}");
    assert!(!shown.contains("abcdefghijkl1234"), "{shown}");
}
