//! Package `filesystem`: the `filesystem.Filesystem` service's messages.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

use super::json::{self, i64s, timestamp};
use super::{proto_enum, Empty, Timestamp};

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct MoveRequest {
    #[prost(string, tag = "1")]
    pub source: String,
    #[prost(string, tag = "2")]
    pub destination: String,
}

/// `StatRequest`, `MakeDirRequest`, `RemoveRequest`: a path alone.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct PathRequest {
    #[prost(string, tag = "1")]
    pub path: String,
}

/// `StatResponse`, `MakeDirResponse`, `MoveResponse`: one entry.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct EntryResponse {
    #[prost(message, optional, tag = "1")]
    pub entry: Option<EntryInfo>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct EntryInfo {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(enumeration = "FileType", tag = "2")]
    #[serde(
        serialize_with = "json::enum_ser::<FileType, _>",
        deserialize_with = "json::enum_de::<FileType, _>"
    )]
    pub r#type: i32,
    #[prost(string, tag = "3")]
    pub path: String,
    #[prost(int64, tag = "4")]
    #[serde(with = "i64s")]
    pub size: i64,
    #[prost(uint32, tag = "5")]
    pub mode: u32,
    #[prost(string, tag = "6")]
    pub permissions: String,
    #[prost(string, tag = "7")]
    pub owner: String,
    #[prost(string, tag = "8")]
    pub group: String,
    #[prost(message, optional, tag = "9")]
    #[serde(with = "timestamp", skip_serializing_if = "Option::is_none")]
    pub modified_time: Option<Timestamp>,
    #[prost(string, optional, tag = "10")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    #[prost(map = "string, string", tag = "11")]
    #[serde(skip_serializing_if = "HashMap::is_empty")]
    pub metadata: HashMap<String, String>,
    #[prost(bool, tag = "12")]
    pub is_symlink: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum FileType {
    Unspecified = 0,
    File = 1,
    Directory = 2,
    Symlink = 3,
}

proto_enum!(FileType {
    FileType::Unspecified => "FILE_TYPE_UNSPECIFIED",
    FileType::File => "FILE_TYPE_FILE",
    FileType::Directory => "FILE_TYPE_DIRECTORY",
    FileType::Symlink => "FILE_TYPE_SYMLINK",
});

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ListDirRequest {
    #[prost(string, tag = "1")]
    pub path: String,
    #[prost(uint32, tag = "2")]
    pub depth: u32,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct ListDirResponse {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<EntryInfo>,
}

/// `WatchDirRequest` and `CreateWatcherRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WatchRequest {
    #[prost(string, tag = "1")]
    pub path: String,
    #[prost(bool, tag = "2")]
    pub recursive: bool,
    #[prost(bool, tag = "3")]
    pub include_entry: bool,
    #[prost(bool, tag = "4")]
    pub allow_network_mounts: bool,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct FilesystemEvent {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(enumeration = "EventType", tag = "2")]
    #[serde(
        serialize_with = "json::enum_ser::<EventType, _>",
        deserialize_with = "json::enum_de::<EventType, _>"
    )]
    pub r#type: i32,
    #[prost(message, optional, tag = "3")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entry: Option<EntryInfo>,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WatchDirResponse {
    #[prost(oneof = "WatchEvent", tags = "1, 2, 3")]
    #[serde(flatten)]
    pub event: Option<WatchEvent>,
}

#[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
// Built once per event and sent at once: its size is no concern.
#[allow(clippy::large_enum_variant)]
#[serde(rename_all = "camelCase")]
pub enum WatchEvent {
    #[prost(message, tag = "1")]
    Start(Empty),
    #[prost(message, tag = "2")]
    Filesystem(FilesystemEvent),
    #[prost(message, tag = "3")]
    Keepalive(Empty),
}

/// `CreateWatcherResponse`, `GetWatcherEventsRequest`, `RemoveWatcherRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct WatcherId {
    #[prost(string, tag = "1")]
    pub watcher_id: String,
}

#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default, rename_all = "camelCase")]
pub struct GetWatcherEventsResponse {
    #[prost(message, repeated, tag = "1")]
    pub events: Vec<FilesystemEvent>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum EventType {
    Unspecified = 0,
    Create = 1,
    Write = 2,
    Remove = 3,
    Rename = 4,
    Chmod = 5,
}

proto_enum!(EventType {
    EventType::Unspecified => "EVENT_TYPE_UNSPECIFIED",
    EventType::Create => "EVENT_TYPE_CREATE",
    EventType::Write => "EVENT_TYPE_WRITE",
    EventType::Remove => "EVENT_TYPE_REMOVE",
    EventType::Rename => "EVENT_TYPE_RENAME",
    EventType::Chmod => "EVENT_TYPE_CHMOD",
});

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    #[test]
    fn entries_speak_protobuf_json() {
        let e = EntryInfo {
            name: "a.txt".into(),
            r#type: FileType::File as i32,
            path: "/tmp/a.txt".into(),
            size: 5,
            mode: 0o644,
            permissions: "-rw-r--r--".into(),
            owner: "root".into(),
            group: "root".into(),
            modified_time: Some(Timestamp {
                seconds: 0,
                nanos: 0,
            }),
            ..Default::default()
        };
        let j = serde_json::to_value(&e).unwrap();
        assert_eq!(j["type"], "FILE_TYPE_FILE");
        assert_eq!(j["size"], "5");
        assert_eq!(j["modifiedTime"], "1970-01-01T00:00:00Z");
        assert_eq!(serde_json::from_value::<EntryInfo>(j).unwrap(), e);
        assert_eq!(EntryInfo::decode(e.encode_to_vec().as_slice()).unwrap(), e);
        let w: WatchRequest =
            serde_json::from_str(r#"{"path":"/tmp","recursive":true,"includeEntry":true}"#)
                .unwrap();
        assert!(w.recursive && w.include_entry);
        let ev = WatchDirResponse {
            event: Some(WatchEvent::Start(Empty {})),
        };
        assert_eq!(serde_json::to_string(&ev).unwrap(), r#"{"start":{}}"#);
    }
}
