//! The engine's two reuse caches, each bounded in bytes and shared by every request of an engine:
//!
//! * **image encodings** (vision tower + projector output), keyed by a hash of the image's
//!   content: the encoded bytes as given, or the pixels of an image given decoded;
//! * **prompt prefixes**: the KV cache and hidden states of a prompt through its last image token,
//!   keyed by those token ids and the images' content keys. A hit is forked, so no request ever
//!   writes into a cached entry.
//!
//! Keys are 128-bit keyed SipHash digests whose keys are drawn per engine, so a client cannot
//! craft two images that collide and read another request's encoding.

use crate::request::ImageInput;
use candle_core::Tensor;
use glance_decode::Prefilled;
use glance_models::internvl::InternImageEncoding;
use glance_models::llava::ImageEncoding;
use glance_models::qwen2_vl::QwenImageEncoding;
use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// A 128-bit digest of an image's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ImageKey(u64, u64);

/// Hashes image content with two independently keyed SipHash instances.
pub struct ContentHasher {
    a: RandomState,
    b: RandomState,
}

impl ContentHasher {
    pub fn new() -> Self {
        Self {
            a: RandomState::new(),
            b: RandomState::new(),
        }
    }

    pub fn key(&self, image: &ImageInput) -> ImageKey {
        let digest = |state: &RandomState| {
            let mut h = state.build_hasher();
            match image {
                ImageInput::Bytes(b) => {
                    0u8.hash(&mut h);
                    b.hash(&mut h);
                }
                ImageInput::Decoded(img) => {
                    1u8.hash(&mut h);
                    (img.width(), img.height(), format!("{:?}", img.color())).hash(&mut h);
                    img.as_bytes().hash(&mut h);
                }
            }
            h.finish()
        };
        ImageKey(digest(&self.a), digest(&self.b))
    }
}

impl Default for ContentHasher {
    fn default() -> Self {
        Self::new()
    }
}

/// A map bounded in bytes that evicts the least recently used entries.
pub struct Lru<K, V> {
    capacity: usize,
    used: usize,
    tick: u64,
    entries: HashMap<K, (V, usize, u64)>,
}

impl<K: Eq + Hash + Clone, V: Clone> Lru<K, V> {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            used: 0,
            tick: 0,
            entries: HashMap::new(),
        }
    }

    pub fn get(&mut self, key: &K) -> Option<V> {
        self.tick += 1;
        let tick = self.tick;
        self.entries.get_mut(key).map(|e| {
            e.2 = tick;
            e.0.clone()
        })
    }

    /// Inserts `value` of `bytes` bytes, evicting old entries to make room. An entry larger than
    /// the whole capacity is not kept.
    pub fn insert(&mut self, key: K, value: V, bytes: usize) {
        if bytes > self.capacity {
            return;
        }
        if let Some((_, old, _)) = self.entries.remove(&key) {
            self.used -= old;
        }
        while self.used + bytes > self.capacity {
            let Some(oldest) = self
                .entries
                .iter()
                .min_by_key(|(_, e)| e.2)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some((_, b, _)) = self.entries.remove(&oldest) {
                self.used -= b;
            }
        }
        self.tick += 1;
        self.used += bytes;
        self.entries.insert(key, (value, bytes, self.tick));
    }

    /// Bytes held.
    pub fn used(&self) -> usize {
        self.used
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

/// One image after the vision tower, as each family encodes it.
pub enum Encoding {
    Llava(ImageEncoding),
    Qwen2Vl(QwenImageEncoding),
    InternVl(InternImageEncoding),
}

impl Encoding {
    /// The image's tokens in the prompt `(tokens, text_hidden)`.
    pub fn features(&self) -> &Tensor {
        match self {
            Encoding::Llava(e) => &e.features,
            Encoding::Qwen2Vl(e) => &e.features,
            Encoding::InternVl(e) => &e.features,
        }
    }

    /// The vision tower's hidden state the features come from.
    pub fn vision_hidden(&self) -> &Tensor {
        match self {
            Encoding::Llava(e) => &e.vision_hidden,
            Encoding::Qwen2Vl(e) => &e.vision_hidden,
            Encoding::InternVl(e) => &e.vision_hidden,
        }
    }

    pub fn llava(&self) -> Option<&ImageEncoding> {
        match self {
            Encoding::Llava(e) => Some(e),
            _ => None,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        let extra = match self {
            Encoding::Llava(e) => e.cls_attention.as_ref().map_or(0, tensor_bytes),
            Encoding::Qwen2Vl(_) => 0,
            Encoding::InternVl(e) => tensor_bytes(&e.cls),
        };
        tensor_bytes(self.features()) + tensor_bytes(self.vision_hidden()) + extra
    }
}

/// An image encoding and what computing it cost.
pub struct CachedEncoding {
    pub encoding: Encoding,
    /// Decoding and pre-processing, when first computed.
    pub preprocess: Duration,
    /// Vision tower and projector, when first computed.
    pub vision: Duration,
}

/// The key of a prompt prefix: its token ids and the content of its images.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PrefixKey {
    pub ids: Vec<u32>,
    pub images: Vec<ImageKey>,
}

/// A prefilled prompt prefix (never written to: requests fork its cache).
pub struct CachedPrefix {
    pub state: Prefilled,
}

/// A cache behind a mutex that a panic elsewhere cannot poison for good.
pub struct Shared<K, V>(Mutex<Lru<K, V>>);

impl<K: Eq + Hash + Clone, V: Clone> Shared<K, V> {
    pub fn new(capacity: usize) -> Self {
        Self(Mutex::new(Lru::new(capacity)))
    }

    pub fn lock(&self) -> MutexGuard<'_, Lru<K, V>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn get(&self, key: &K) -> Option<V> {
        self.lock().get(key)
    }

    pub fn insert(&self, key: K, value: V, bytes: usize) {
        self.lock().insert(key, value, bytes)
    }

    pub fn enabled(&self) -> bool {
        self.lock().capacity > 0
    }

    /// `(entries, bytes)` held now.
    pub fn usage(&self) -> (usize, usize) {
        let c = self.lock();
        (c.len(), c.used())
    }
}

pub type EncodingCache = Shared<ImageKey, Arc<CachedEncoding>>;
pub type PrefixCache = Shared<PrefixKey, Arc<CachedPrefix>>;

/// Bytes of an f32 (or any dtype) tensor's elements.
pub fn tensor_bytes(t: &candle_core::Tensor) -> usize {
    t.elem_count() * t.dtype().size_in_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_is_bounded_in_bytes_and_evicts_the_oldest() {
        let mut c: Lru<u32, &str> = Lru::new(10);
        c.insert(1, "a", 4);
        c.insert(2, "b", 4);
        assert_eq!(c.get(&1), Some("a")); // 1 is now the most recent
        c.insert(3, "c", 4); // evicts 2
        assert_eq!(c.get(&2), None);
        assert_eq!((c.get(&1), c.get(&3)), (Some("a"), Some("c")));
        assert_eq!(c.used(), 8);
        c.insert(4, "too big", 11);
        assert_eq!(c.get(&4), None);
        c.insert(1, "a2", 2); // replacing frees the old size
        assert_eq!(c.used(), 6);
        let mut off: Lru<u32, u32> = Lru::new(0);
        off.insert(1, 1, 1);
        assert_eq!(off.len(), 0);
    }

    #[test]
    fn content_keys_follow_the_content() {
        let h = ContentHasher::new();
        let a = ImageInput::bytes(vec![1u8, 2, 3]);
        let b = ImageInput::bytes(vec![1u8, 2, 4]);
        assert_eq!(h.key(&a), h.key(&ImageInput::bytes(vec![1u8, 2, 3])));
        assert_ne!(h.key(&a), h.key(&b));
        let img = |v: u8| {
            ImageInput::decoded(image::DynamicImage::ImageRgb8(image::RgbImage::from_pixel(
                2,
                3,
                image::Rgb([v, v, v]),
            )))
        };
        assert_eq!(h.key(&img(7)), h.key(&img(7)));
        assert_ne!(h.key(&img(7)), h.key(&img(8)));
        // Another engine keys differently.
        assert_ne!(ContentHasher::new().key(&a), h.key(&a));
    }
}
