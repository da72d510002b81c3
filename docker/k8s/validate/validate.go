// Package validate checks the Kubernetes manifests in docker/k8s by decoding them strictly
// into the k8s.io/api types: an unknown field, a wrong type, a malformed quantity or an
// unsupported kind is an error, as is a reference between the manifests that does not
// resolve (selectors, the Secret and ConfigMap the Deployment uses, probe ports).
package validate

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"
)

// Set is every object of a directory of manifests, by kind.
type Set struct {
	Deployments []*appsv1.Deployment
	Secrets     []*corev1.Secret
	ConfigMaps  []*corev1.ConfigMap
	Services    []*corev1.Service
	PDBs        []*policyv1.PodDisruptionBudget
}

// Kinds lists the kinds present, sorted.
func (s *Set) Kinds() []string {
	var kinds []string
	add := func(n int, kind string) {
		if n > 0 {
			kinds = append(kinds, kind)
		}
	}
	add(len(s.Deployments), "Deployment")
	add(len(s.Secrets), "Secret")
	add(len(s.ConfigMaps), "ConfigMap")
	add(len(s.Services), "Service")
	add(len(s.PDBs), "PodDisruptionBudget")
	sort.Strings(kinds)
	return kinds
}

// LoadDir strictly decodes every *.yaml file of dir (not its subdirectories, like
// `kubectl apply -f dir`), then checks the references between the objects.
func LoadDir(dir string) (*Set, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no *.yaml manifests in %s", dir)
	}
	set := &Set{}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		for i, doc := range splitDocuments(data) {
			if err := set.add(doc); err != nil {
				return nil, fmt.Errorf("%s (document %d): %w", filepath.Base(file), i+1, err)
			}
		}
	}
	if err := set.checkReferences(); err != nil {
		return nil, err
	}
	return set, nil
}

func splitDocuments(data []byte) [][]byte {
	var docs [][]byte
	for _, part := range bytes.Split(data, []byte("\n---")) {
		trimmed := bytes.TrimSpace(part)
		if len(bytes.TrimSpace(stripComments(trimmed))) > 0 {
			docs = append(docs, part)
		}
	}
	return docs
}

func stripComments(doc []byte) []byte {
	var out [][]byte
	for _, line := range bytes.Split(doc, []byte("\n")) {
		if !bytes.HasPrefix(bytes.TrimSpace(line), []byte("#")) {
			out = append(out, line)
		}
	}
	return bytes.Join(out, []byte("\n"))
}

func (s *Set) add(doc []byte) error {
	var meta metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &meta); err != nil {
		return err
	}
	var obj interface{}
	switch meta.APIVersion + "/" + meta.Kind {
	case "apps/v1/Deployment":
		d := &appsv1.Deployment{}
		s.Deployments, obj = append(s.Deployments, d), d
	case "v1/Secret":
		o := &corev1.Secret{}
		s.Secrets, obj = append(s.Secrets, o), o
	case "v1/ConfigMap":
		o := &corev1.ConfigMap{}
		s.ConfigMaps, obj = append(s.ConfigMaps, o), o
	case "v1/Service":
		o := &corev1.Service{}
		s.Services, obj = append(s.Services, o), o
	case "policy/v1/PodDisruptionBudget":
		o := &policyv1.PodDisruptionBudget{}
		s.PDBs, obj = append(s.PDBs, o), o
	default:
		return fmt.Errorf("unsupported apiVersion/kind %q", meta.APIVersion+"/"+meta.Kind)
	}
	// UnmarshalStrict: duplicate keys and fields the type does not have are errors.
	return yaml.UnmarshalStrict(doc, obj)
}

func (s *Set) checkReferences() error {
	var problems []string
	fail := func(format string, args ...interface{}) {
		problems = append(problems, fmt.Sprintf(format, args...))
	}
	secrets, configMaps := map[string]*corev1.Secret{}, map[string]bool{}
	for _, o := range s.Secrets {
		secrets[o.Name] = o
	}
	for _, o := range s.ConfigMaps {
		configMaps[o.Name] = true
	}
	var podLabels []labels.Set
	for _, d := range s.Deployments {
		pod := labels.Set(d.Spec.Template.Labels)
		podLabels = append(podLabels, pod)
		selector, err := metav1.LabelSelectorAsSelector(d.Spec.Selector)
		if err != nil || d.Spec.Selector == nil || !selector.Matches(pod) {
			fail("Deployment %s: selector does not match its pod labels", d.Name)
		}
		spec := d.Spec.Template.Spec
		volumes := map[string]bool{}
		for _, v := range spec.Volumes {
			volumes[v.Name] = true
			if v.ConfigMap != nil && !configMaps[v.ConfigMap.Name] {
				fail("Deployment %s: volume %s uses missing ConfigMap %s", d.Name, v.Name, v.ConfigMap.Name)
			}
		}
		for _, c := range spec.Containers {
			ports := map[string]bool{}
			for _, p := range c.Ports {
				ports[p.Name] = true
			}
			for _, probe := range []*corev1.Probe{c.LivenessProbe, c.ReadinessProbe, c.StartupProbe} {
				if probe != nil && probe.HTTPGet != nil && probe.HTTPGet.Port.StrVal != "" &&
					!ports[probe.HTTPGet.Port.StrVal] {
					fail("container %s: probe port %s is not a named port", c.Name, probe.HTTPGet.Port.StrVal)
				}
			}
			for _, m := range c.VolumeMounts {
				if !volumes[m.Name] {
					fail("container %s: mounts missing volume %s", c.Name, m.Name)
				}
			}
			for _, e := range c.Env {
				if e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil {
					continue
				}
				ref := e.ValueFrom.SecretKeyRef
				if !hasKey(secrets[ref.Name], ref.Key) {
					fail("container %s: env %s uses missing secret key %s/%s", c.Name, e.Name, ref.Name, ref.Key)
				}
			}
		}
	}
	matchesPods := func(selector labels.Selector) bool {
		for _, pod := range podLabels {
			if selector.Matches(pod) {
				return true
			}
		}
		return false
	}
	for _, svc := range s.Services {
		if len(svc.Spec.Selector) == 0 || !matchesPods(labels.SelectorFromSet(svc.Spec.Selector)) {
			fail("Service %s: selector matches no pod", svc.Name)
		}
	}
	for _, pdb := range s.PDBs {
		selector, err := metav1.LabelSelectorAsSelector(pdb.Spec.Selector)
		if err != nil || pdb.Spec.Selector == nil || !matchesPods(selector) {
			fail("PodDisruptionBudget %s: selector matches no pod", pdb.Name)
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("references: %s", strings.Join(problems, "; "))
	}
	return nil
}

func hasKey(secret *corev1.Secret, key string) bool {
	if secret == nil {
		return false
	}
	if _, ok := secret.StringData[key]; ok {
		return true
	}
	_, ok := secret.Data[key]
	return ok
}
