// ImageFolder (scan, batched decode) and write_image_folder (the Fashion-MNIST-based
// generator).
//
// The scan reproduces torchvision's find_classes + make_dataset ordering (see the
// header). A batch is allocated once as u8 [N, S, S, 3] and each sample's pipeline
// writes its S x S x 3 slice in place; file bytes go through a per-thread buffer, so
// a batch allocates nothing per sample beyond libjpeg's own decode buffer.
#include "dltrain/data/image_folder.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dltrain/core/error.hpp"
#include "dltrain/core/parallel.hpp"

namespace dltrain::data {

namespace fs = std::filesystem;

namespace {

std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

bool accepted(const std::string& name, const std::vector<std::string>& exts_lower) {
  const std::string n = lower(name);
  for (const auto& e : exts_lower)
    if (n.size() >= e.size() && n.compare(n.size() - e.size(), e.size(), e) == 0) return true;
  return false;
}

}  // namespace

ImageFolder::ImageFolder(std::string root, ImageFolderOptions options)
    : root_(std::move(root)), options_(std::move(options)) {
  options_.transform.check();
  DLTRAIN_CHECK(!options_.extensions.empty(),
                "ImageFolder: options.extensions is empty; use e.g. {\".jpg\", \".jpeg\"}");
  std::error_code ec;
  DLTRAIN_CHECK(fs::exists(root_, ec), "ImageFolder: root '", root_,
                "' does not exist; pass the folder that holds one sub-folder per class "
                "(e.g. .../imagenet/train)");
  DLTRAIN_CHECK(fs::is_directory(root_, ec), "ImageFolder: root '", root_, "' is not a directory");

  for (const auto& entry : fs::directory_iterator(root_))
    if (entry.is_directory()) classes_.push_back(entry.path().filename().string());
  std::sort(classes_.begin(), classes_.end());
  DLTRAIN_CHECK(!classes_.empty(), "ImageFolder: '", root_,
                "' holds no class folder; expected one sub-folder per class, e.g. ", root_,
                "/n01440764/*.JPEG");

  std::vector<std::string> exts;
  for (const auto& e : options_.extensions) exts.push_back(lower(e));
  for (size_t c = 0; c < classes_.size(); ++c) {
    const fs::path dir = fs::path(root_) / classes_[c];
    // torchvision walks with os.walk(followlinks=True) and sorts by (directory, file name).
    std::vector<std::pair<std::string, std::string>> files;
    for (auto it =
             fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink);
         it != fs::recursive_directory_iterator(); ++it) {
      if (!it->is_regular_file()) continue;
      const std::string name = it->path().filename().string();
      if (accepted(name, exts)) files.emplace_back(it->path().parent_path().string(), name);
    }
    DLTRAIN_CHECK(!files.empty(), "ImageFolder: class folder '", dir.string(),
                  "' holds no file with an accepted extension (", join(options_.extensions),
                  "); add images or remove the folder");
    std::sort(files.begin(), files.end());
    for (const auto& [d, name] : files)
      samples_.emplace_back((fs::path(d) / name).string(), static_cast<int64_t>(c));
  }
}

std::vector<int64_t> ImageFolder::targets() const {
  std::vector<int64_t> t;
  t.reserve(samples_.size());
  for (const auto& s : samples_) t.push_back(s.second);
  return t;
}

int64_t ImageFolder::load_into(int64_t index, int64_t epoch, uint8_t* out,
                               std::vector<uint8_t>& buf) const {
  const int64_t n = size();
  for (int64_t attempt = 0; attempt < n; ++attempt) {
    const int64_t j = (index + attempt) % n;
    const auto& [path, label] = samples_[static_cast<size_t>(j)];
    try {
      read_file_bytes(path, buf);
      options_.transform.apply_jpeg(buf.data(), buf.size(), options_.seed, epoch, j, out);
      return label;
    } catch (const Error& e) {
      if (options_.on_corrupt == CorruptPolicy::Error)
        DLTRAIN_FAIL("ImageFolder: cannot load '", path, "' (sample ", j, "): ", e.what(),
                     ". Fix or delete the file, or construct the ImageFolder with on_corrupt = "
                     "CorruptPolicy::Skip to replace such samples");
      skipped_.fetch_add(1);
    }
  }
  DLTRAIN_FAIL("ImageFolder: none of the ", n, " files under '", root_,
               "' could be decoded; are they JPEGs?");
}

Batch ImageFolder::get_batch_for_epoch(const std::vector<int64_t>& indices, int64_t epoch) const {
  DLTRAIN_CHECK(!indices.empty(), "ImageFolder::get_batch: the index list is empty");
  DLTRAIN_CHECK(epoch >= 0, "ImageFolder::get_batch: epoch must be >= 0, got ", epoch);
  for (int64_t i : indices)
    DLTRAIN_CHECK(i >= 0 && i < size(), "ImageFolder: index ", i, " is out of range for ", size(),
                  " samples under '", root_, "'");
  const int64_t n = static_cast<int64_t>(indices.size()), s = options_.transform.size;
  const int64_t sample_bytes = s * s * 3;
  Tensor data = empty({n, s, s, 3}, DType::u8);
  Tensor target = empty({n}, DType::i64);
  uint8_t* d = data.data<uint8_t>();
  int64_t* t = target.data<int64_t>();
  auto body = [&](int64_t b, int64_t e) {
    thread_local std::vector<uint8_t> buf;
    for (int64_t i = b; i < e; ++i)
      t[i] = load_into(indices[static_cast<size_t>(i)], epoch, d + i * sample_bytes, buf);
  };
  for_each_sample(n, body);
  return {data, target};
}

Example ImageFolder::get(int64_t index) const {
  Batch b = get_batch_for_epoch({index}, epoch());
  return {b.data.select(0, 0), b.target.select(0, 0)};
}

// --- write_image_folder --------------------------------------------------------------

std::vector<std::string> image_folder_class_names(int64_t classes) {
  static const char* kNames[10] = {"tshirt", "trouser", "pullover", "dress", "coat",
                                   "sandal", "shirt",   "sneaker",  "bag",   "boot"};
  DLTRAIN_CHECK(classes >= 1 && classes <= 10,
                "image_folder_class_names: classes must be in 1..10 (the Fashion-MNIST "
                "classes), got ",
                classes);
  std::vector<std::string> out;
  for (int64_t c = 0; c < classes; ++c) {
    char wnid[16];
    std::snprintf(wnid, sizeof wnid, "n%08d", static_cast<int>(c));
    out.push_back(std::string(wnid) + "_" + kNames[c]);
  }
  return out;
}

int64_t write_image_folder(const std::string& out_dir, const Tensor& images, const Tensor& labels,
                           const MakeImageFolderOptions& o) {
  const auto names = image_folder_class_names(o.classes);
  DLTRAIN_CHECK(o.per_class >= 1, "write_image_folder: per_class must be >= 1, got ", o.per_class);
  DLTRAIN_CHECK(o.size >= 8 && o.size <= 8192, "write_image_folder: size must be in 8..8192, got ",
                o.size);
  DLTRAIN_CHECK(o.quality >= 1 && o.quality <= 100,
                "write_image_folder: quality must be in 1..100, got ", o.quality);
  DLTRAIN_CHECK(images.defined() && labels.defined(), "write_image_folder: undefined tensors");
  const bool u8_form = images.dim() == 3 && images.size(1) == 28 && images.size(2) == 28;
  const bool f_form =
      images.dim() == 4 && images.size(1) == 1 && images.size(2) == 28 && images.size(3) == 28;
  DLTRAIN_CHECK(u8_form || f_form,
                "write_image_folder: expected images u8 [N, 28, 28] or float [N, 1, 28, 28] "
                "(data::MNIST), got ",
                shape_str(images.shape()));
  DLTRAIN_CHECK(labels.dim() == 1 && labels.size(0) == images.size(0),
                "write_image_folder: labels must be [N] with N = ", images.size(0), ", got ",
                shape_str(labels.shape()));
  const int64_t total = images.size(0);
  std::vector<uint8_t> pix(static_cast<size_t>(total * 28 * 28));
  if (u8_form) {
    const auto v = images.contiguous().to(DType::u8).to_vector<uint8_t>();
    std::copy(v.begin(), v.end(), pix.begin());
  } else {
    const auto v = images.contiguous().to(DType::f32).to_vector<float>();
    for (size_t i = 0; i < v.size(); ++i)
      pix[i] = static_cast<uint8_t>(std::clamp(std::lround(v[i] * 255.f), 0L, 255L));
  }
  const auto lab = labels.to(DType::i64).to_vector<int64_t>();

  // Per class, a seeded Fisher-Yates shuffle of its samples; the first per_class are used.
  std::vector<int64_t> chosen;
  for (int64_t c = 0; c < o.classes; ++c) {
    std::vector<int64_t> idx;
    for (int64_t i = 0; i < total; ++i)
      if (lab[static_cast<size_t>(i)] == c) idx.push_back(i);
    DLTRAIN_CHECK(static_cast<int64_t>(idx.size()) >= o.per_class, "write_image_folder: class ", c,
                  " has ", idx.size(), " images, fewer than per_class = ", o.per_class);
    SampleRandom r(o.seed, 0, c, 7);
    for (int64_t i = static_cast<int64_t>(idx.size()) - 1; i > 0; --i)
      std::swap(idx[static_cast<size_t>(i)], idx[static_cast<size_t>(r.randint(0, i + 1))]);
    chosen.insert(chosen.end(), idx.begin(), idx.begin() + o.per_class);
  }
  for (const auto& nm : names) fs::create_directories(fs::path(out_dir) / nm);

  const int64_t jobs = o.classes * o.per_class;
  parallel_for(0, jobs, 1, [&](int64_t b, int64_t e) {
    for (int64_t job = b; job < e; ++job) {
      const int64_t c = job / o.per_class, k = job % o.per_class;
      SampleRandom r(o.seed, 1, job, 0);
      const double side = static_cast<double>(o.size) * r.uniform(0.75, 1.25);
      const double aspect = std::exp(r.uniform(std::log(3.0 / 4.0), std::log(4.0 / 3.0)));
      const int64_t h = std::max<int64_t>(8, std::llround(aspect >= 1 ? side : side / aspect));
      const int64_t w = std::max<int64_t>(8, std::llround(aspect >= 1 ? side * aspect : side));
      Image g(28, 28, 1);
      std::copy_n(pix.begin() + chosen[static_cast<size_t>(job)] * 784, 784, g.pixels.begin());
      const Image big = resize(g, h, w);
      // Colours: a dark background gradient and a bright foreground, both per image.
      float bg0[3], bg1[3], fg[3];
      for (int ch = 0; ch < 3; ++ch) {
        bg0[ch] = static_cast<float>(r.uniform(0, 110));
        bg1[ch] = static_cast<float>(r.uniform(0, 110));
        fg[ch] = static_cast<float>(r.uniform(130, 255));
      }
      Image img(w, h, 3);
      SampleRandom noise(o.seed, 2, job, 0);
      for (int64_t y = 0; y < h; ++y) {
        const float ty = static_cast<float>(y) / static_cast<float>(h - 1);
        for (int64_t x = 0; x < w; ++x) {
          const float v = static_cast<float>(big.at(y, x)) / 255.f;
          const float n = static_cast<float>(noise.uniform(-6, 6));
          for (int ch = 0; ch < 3; ++ch) {
            const float bgc = bg0[ch] + (bg1[ch] - bg0[ch]) * ty;
            img.at(y, x, ch) =
                static_cast<uint8_t>(std::clamp(bgc + (fg[ch] - bgc) * v + n, 0.f, 255.f));
          }
        }
      }
      const auto bytes = encode_jpeg(img, o.quality);
      char file[32];
      std::snprintf(file, sizeof file, "_%05d.JPEG", static_cast<int>(k));
      const fs::path path = fs::path(out_dir) / names[static_cast<size_t>(c)] /
                            (names[static_cast<size_t>(c)].substr(0, 9) + file);
      std::ofstream f(path, std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
      DLTRAIN_CHECK(f.good(), "write_image_folder: cannot write '", path.string(), "'");
    }
  });
  return jobs;
}

}  // namespace dltrain::data
