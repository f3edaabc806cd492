//! Package `process`: the `process.Process` service's messages.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

use super::json::{self, b64};
use super::{proto_enum, Empty};

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct Pty {
    #[prost(message, optional, tag = "1")]
    pub size: Option<PtySize>,
}

#[derive(Clone, Copy, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PtySize {
    #[prost(uint32, tag = "1")]
    pub cols: u32,
    #[prost(uint32, tag = "2")]
    pub rows: u32,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProcessConfig {
    #[prost(string, tag = "1")]
    pub cmd: String,
    #[prost(string, repeated, tag = "2")]
    pub args: Vec<String>,
    #[prost(map = "string, string", tag = "3")]
    pub envs: HashMap<String, String>,
    #[prost(string, optional, tag = "4")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProcessInfo {
    #[prost(message, optional, tag = "1")]
    pub config: Option<ProcessConfig>,
    #[prost(uint32, tag = "2")]
    pub pid: u32,
    #[prost(string, optional, tag = "3")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ListResponse {
    #[prost(message, repeated, tag = "1")]
    pub processes: Vec<ProcessInfo>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StartRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessConfig>,
    #[prost(message, optional, tag = "2")]
    pub pty: Option<Pty>,
    #[prost(string, optional, tag = "3")]
    pub tag: Option<String>,
    #[prost(bool, optional, tag = "4")]
    pub stdin: Option<bool>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct UpdateRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessSelector>,
    #[prost(message, optional, tag = "2")]
    pub pty: Option<Pty>,
}

/// `ProcessEvent`; also the one field of `StartResponse` and `ConnectResponse`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProcessEvent {
    #[prost(oneof = "Event", tags = "1, 2, 3, 4")]
    #[serde(flatten)]
    pub event: Option<Event>,
}

#[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Event {
    #[prost(message, tag = "1")]
    Start(StartEvent),
    #[prost(message, tag = "2")]
    Data(DataEvent),
    #[prost(message, tag = "3")]
    End(EndEvent),
    #[prost(message, tag = "4")]
    Keepalive(Empty),
}

#[derive(Clone, Copy, PartialEq, Eq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StartEvent {
    #[prost(uint32, tag = "1")]
    pub pid: u32,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct DataEvent {
    #[prost(oneof = "Output", tags = "1, 2, 3")]
    #[serde(flatten)]
    pub output: Option<Output>,
}

#[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Output {
    #[prost(bytes, tag = "1")]
    Stdout(#[serde(with = "b64")] Vec<u8>),
    #[prost(bytes, tag = "2")]
    Stderr(#[serde(with = "b64")] Vec<u8>),
    #[prost(bytes, tag = "3")]
    Pty(#[serde(with = "b64")] Vec<u8>),
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct EndEvent {
    #[prost(sint32, tag = "1")]
    pub exit_code: i32,
    #[prost(bool, tag = "2")]
    pub exited: bool,
    #[prost(string, tag = "3")]
    pub status: String,
    #[prost(string, optional, tag = "4")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// `StartResponse` and `ConnectResponse` (the same shape).
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct EventResponse {
    #[prost(message, optional, tag = "1")]
    pub event: Option<ProcessEvent>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SendInputRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessSelector>,
    #[prost(message, optional, tag = "2")]
    pub input: Option<ProcessInput>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProcessInput {
    #[prost(oneof = "Input", tags = "1, 2")]
    #[serde(flatten)]
    pub input: Option<Input>,
}

#[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Input {
    #[prost(bytes, tag = "1")]
    Stdin(#[serde(with = "b64")] Vec<u8>),
    #[prost(bytes, tag = "2")]
    Pty(#[serde(with = "b64")] Vec<u8>),
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StreamInputRequest {
    #[prost(oneof = "StreamInputEvent", tags = "1, 2, 3")]
    #[serde(flatten)]
    pub event: Option<StreamInputEvent>,
}

#[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum StreamInputEvent {
    #[prost(message, tag = "1")]
    Start(SelectorOnly),
    #[prost(message, tag = "2")]
    Data(StreamInputData),
    #[prost(message, tag = "3")]
    Keepalive(Empty),
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct StreamInputData {
    #[prost(message, optional, tag = "2")]
    pub input: Option<ProcessInput>,
}

/// `ConnectRequest`, `CloseStdinRequest` and `StreamInputRequest.StartEvent`: a selector alone.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SelectorOnly {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessSelector>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum Signal {
    Unspecified = 0,
    Sigterm = 15,
    Sigkill = 9,
}

proto_enum!(Signal {
    Signal::Unspecified => "SIGNAL_UNSPECIFIED",
    Signal::Sigterm => "SIGNAL_SIGTERM",
    Signal::Sigkill => "SIGNAL_SIGKILL",
});

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct SendSignalRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessSelector>,
    #[prost(enumeration = "Signal", tag = "2")]
    #[serde(
        serialize_with = "json::enum_ser::<Signal, _>",
        deserialize_with = "json::enum_de::<Signal, _>"
    )]
    pub signal: i32,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ProcessSelector {
    #[prost(oneof = "Selector", tags = "1, 2")]
    #[serde(flatten)]
    pub selector: Option<Selector>,
}

#[derive(Clone, PartialEq, Eq, prost::Oneof, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Selector {
    #[prost(uint32, tag = "1")]
    Pid(u32),
    #[prost(string, tag = "2")]
    Tag(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn events_speak_protobuf_json() {
        let ev = EventResponse {
            event: Some(ProcessEvent {
                event: Some(Event::Data(DataEvent {
                    output: Some(Output::Stdout(b"hi\n".to_vec())),
                })),
            }),
        };
        let j = serde_json::to_value(&ev).unwrap();
        assert_eq!(
            j,
            serde_json::json!({"event": {"data": {"stdout": "aGkK"}}})
        );
        let back: EventResponse = serde_json::from_value(j).unwrap();
        assert_eq!(back, ev);
        let end = ProcessEvent {
            event: Some(Event::End(EndEvent {
                exit_code: -1,
                exited: false,
                status: "signal: killed".into(),
                error: None,
            })),
        };
        assert_eq!(
            serde_json::to_value(&end).unwrap(),
            serde_json::json!({"end": {"exitCode": -1, "exited": false, "status": "signal: killed"}})
        );
        assert_eq!(
            ProcessEvent::decode(end.encode_to_vec().as_slice()).unwrap(),
            end
        );
    }

    #[test]
    fn requests_parse_as_the_sdk_sends_them() {
        let r: StartRequest = serde_json::from_str(
            r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{"A":"1"},"cwd":"/tmp"},"stdin":false,"unknownField":1}"#,
        )
        .unwrap();
        let p = r.process.unwrap();
        assert_eq!(p.args, ["-l", "-c", "echo hi"]);
        assert_eq!(p.cwd.as_deref(), Some("/tmp"));
        assert_eq!(r.stdin, Some(false));
        let s: SendSignalRequest =
            serde_json::from_str(r#"{"process":{"pid":7},"signal":"SIGNAL_SIGKILL"}"#).unwrap();
        assert_eq!(s.signal, Signal::Sigkill as i32);
        assert_eq!(s.process.unwrap().selector, Some(Selector::Pid(7)));
        let s: SendSignalRequest = serde_json::from_str(r#"{"signal":15}"#).unwrap();
        assert_eq!(s.signal, 15);
        assert!(s.process.is_none());
        let i: SendInputRequest =
            serde_json::from_str(r#"{"process":{"tag":"t"},"input":{"stdin":"aGk="}}"#).unwrap();
        assert_eq!(i.input.unwrap().input, Some(Input::Stdin(b"hi".to_vec())));
        assert!(serde_json::from_str::<SendSignalRequest>(r#"{"signal":"SIGHUP"}"#).is_err());
        let k: StreamInputRequest = serde_json::from_str(r#"{"keepalive":{}}"#).unwrap();
        assert_eq!(k.event, Some(StreamInputEvent::Keepalive(Empty {})));
    }
}
