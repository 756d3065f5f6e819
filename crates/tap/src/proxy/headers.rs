//! Reading header blocks (HPACK, RFC 7541) as they pass, one decoder per direction, kept in
//! step with the peers' dynamic tables so that every block decodes as its receiver decodes it.
//! Only the few fields observation needs are copied out ([`Headers`]); every other value, the
//! `authorization` header's among them, is read past and never kept beyond the table the
//! protocol itself requires.

use loona_hpack::Decoder;

/// The most dynamic table the tap keeps per direction: a peer that asks for more stops
/// observation of that connection (forwarding goes on), so memory per connection stays
/// bounded whatever the peers agree between them.
pub const MAX_TABLE: usize = 64 << 10;

/// The most a header block may decode to (RFC 7541 sizes: name, value and 32 bytes a field), as
/// h2's `max_header_list_size`: one-byte references to a large table entry would otherwise turn
/// a 16 KiB block into 64 MB of fields. Past it the block is an error and observation of that
/// connection stops; Envoy itself accepts 60 KiB of request headers by default.
pub const MAX_HEADER_LIST: usize = 256 << 10;

/// The header fields the tap reads. Everything else is passed over.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Headers {
    /// `:path`.
    pub path: Option<String>,
    /// `:status`.
    pub status: Option<String>,
    /// `content-type`.
    pub content_type: Option<String>,
    /// `grpc-encoding`.
    pub grpc_encoding: Option<String>,
    /// `grpc-status`.
    pub grpc_status: Option<String>,
    /// `grpc-message` (still percent-encoded).
    pub grpc_message: Option<String>,
}

impl Headers {
    /// Whether the request is gRPC (`content-type: application/grpc...`).
    pub fn is_grpc(&self) -> bool {
        self.content_type
            .as_deref()
            .is_some_and(|c| c.starts_with("application/grpc"))
    }

    /// Keeps `value` when `name` is a field the tap reads and not seen yet in the block (a
    /// repeat is no more use, and would be copied again).
    fn take(&mut self, name: &[u8], value: &[u8]) {
        let slot = match name {
            b":path" => &mut self.path,
            b":status" => &mut self.status,
            b"content-type" => &mut self.content_type,
            b"grpc-encoding" => &mut self.grpc_encoding,
            b"grpc-status" => &mut self.grpc_status,
            b"grpc-message" => &mut self.grpc_message,
            _ => return,
        };
        if slot.is_none() {
            *slot = Some(String::from_utf8_lossy(value).into_owned());
        }
    }
}

/// A header block that does not decode, or decodes to too much; the decoder's state is lost
/// with it.
#[derive(Debug, thiserror::Error)]
#[error("HPACK: {message}")]
pub struct HpackError {
    message: String,
    /// Past [`MAX_HEADER_LIST`].
    pub oversized: bool,
}

/// One direction's HPACK decoder.
pub struct HeaderReader {
    decoder: Decoder<'static>,
}

impl Default for HeaderReader {
    fn default() -> Self {
        let mut decoder = Decoder::new();
        decoder.set_max_allowed_table_size(4096);
        HeaderReader { decoder }
    }
}

impl HeaderReader {
    /// The receiving side announced SETTINGS_HEADER_TABLE_SIZE `n`: the sender may size its
    /// table up to it. The initial 4,096 stays allowed (blocks encoded before the sender saw
    /// the setting), and past `MAX_TABLE` the tap does not follow.
    pub fn allow_table_size(&mut self, n: u32) {
        let n = (n as usize).clamp(4096, MAX_TABLE);
        self.decoder.set_max_allowed_table_size(n);
    }

    /// Decodes a whole header block, keeping the fields [`Headers`] names. Its work is linear in
    /// the block's bytes: past [`MAX_HEADER_LIST`] decoded, fields are counted, not looked at.
    pub fn read(&mut self, block: &[u8]) -> Result<Headers, HpackError> {
        let mut headers = Headers::default();
        let mut size = 0usize;
        self.decoder
            .decode_with_cb(block, |name, value| {
                size = size.saturating_add(name.len() + value.len() + 32);
                if size <= MAX_HEADER_LIST {
                    headers.take(&name, &value);
                }
            })
            .map_err(|e| HpackError {
                message: format!("{e:?}"),
                oversized: false,
            })?;
        if size > MAX_HEADER_LIST {
            let message = format!(
                "a {}-byte block decodes to more than {} KiB of fields",
                block.len(),
                MAX_HEADER_LIST >> 10
            );
            return Err(HpackError {
                message,
                oversized: true,
            });
        }
        Ok(headers)
    }
}
